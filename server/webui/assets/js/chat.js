// Streams: send a message, follow the answer, stop it, skip its thinking, and resume it after a reload.
//
// Every answer streams as the resumable session "<conversation>::<model>". The message keeps
// `stream = {key, offset, completionId}`, saved before the request is sent and then together with the text,
// so `offset` (bytes of whole SSE events applied) always matches the saved text: resuming asks for
// `GET /v1/stream?from=offset` and appends what follows, never a byte twice.
import { SseSplitter, errorMessage } from "./api.js";
import { newId, sleep } from "./dom.js";
import { lastLeafUnder, normalize, pathOf, siblingsOf, subtreeIds } from "./tree.js";

const SAVE_EVERY_MS = 250;
const RETRY_MS = 2000;

/** Statuses a message shows: streaming, resuming, loading (server busy loading), stopped, lost, error. */
export const LIVE_STATUSES = new Set(["streaming", "resuming", "loading"]);

export class Chat {
  constructor({ store, api, settings, onUpdate, toolsFor = null }) {
    this.store = store;
    // (conversation) -> the request's `mcp` tools fields ({tools, approved_tools?}); default: its servers
    this.toolsFor = toolsFor;
    this.api = api;
    this.settings = settings;
    this.onUpdate = onUpdate; // (conversation, message) after every visible change
    this.runs = new Map(); // conversation id -> the run streaming into it
  }

  isBusy(conversationId) {
    return this.runs.has(conversationId);
  }

  /** True while the answer streams its reasoning and no answer text has come yet. */
  isThinking(conversationId) {
    const run = this.runs.get(conversationId);
    return Boolean(run && !run.skipRequested && run.message.reasoning && !run.message.content);
  }

  /** Send a user message (its text; the images and audio files attached to it: [{id, name, url, kind?,
   * format?}], kept in `images`; the text files and PDFs: [{id, name, kind: "text" | "pdf", text}], kept
   * in `files`) after the shown branch's last message, and stream the answer. */
  async send(conversation, text, model, images = [], files = []) {
    const message = { id: newId(), role: "user", content: text, createdAt: Date.now() };
    if (images.length) message.images = images;
    if (files.length) message.files = files;
    this.#append(conversation, message);
    await this.#answer(conversation, model);
  }

  /** Answer a question again: the new answer is a sibling of `answerId` (default: the shown branch's
   * last answer), and the shown branch. */
  async regenerate(conversation, model, answerId = null) {
    if (this.isBusy(conversation.id)) return;
    const find = (id) => conversation.messages.find((m) => m.id === id);
    const target = answerId ? find(answerId) : pathOf(conversation).at(-1);
    const question = target?.role === "assistant" ? find(target.parent) : target;
    if (question?.role !== "user") return;
    conversation.leaf = question.id;
    await this.#answer(conversation, model);
  }

  /** A changed user message: a sibling of the old one (same attachments, the new text) is the shown
   * branch, answered anew; the old branch stays, a `<` away. */
  async edit(conversation, messageId, text, model) {
    const old = conversation.messages.find((m) => m.id === messageId && m.role === "user");
    if (!old || this.isBusy(conversation.id)) return;
    const message = { id: newId(), role: "user", content: text, createdAt: Date.now() };
    if (old.images?.length) message.images = old.images.map((image) => ({ ...image }));
    if (old.files?.length) message.files = old.files.map((file) => ({ ...file }));
    this.#append(conversation, message, old.parent);
    await this.#answer(conversation, model);
  }

  /** Continue a cut answer (stopped, or ended by its length limit): the branch goes out with the answer
   * last and `continue_final_message`, so the server writes on from its last token; what comes is
   * appended to the same message. */
  async continue(conversation, messageId, model) {
    const message = conversation.messages.find((m) => m.id === messageId && m.role === "assistant");
    if (!message || !message.content || this.isBusy(conversation.id)) return;
    conversation.leaf = messageId;
    const history = this.#history(pathOf(conversation), conversation.preset);
    const key = `${conversation.id}::${model}`;
    Object.assign(message, { status: "streaming", stream: { key, offset: 0, completionId: null } });
    delete message.finishReason;
    delete message.error;
    conversation.updatedAt = Date.now();
    await this.#start(conversation, message, model, history, { continue_final_message: true });
  }

  /** Go on with an answer the server paused before a tool that writes or runs commands
   * (`pendingApproval`): the calls the user denied (`denied`: tool names) get a result saying so, the
   * branch goes out ending in the paused round's calls (the server runs the others, now approved, first)
   * and what comes is appended to the same message. */
  async resumeTools(conversation, messageId, model, denied = []) {
    const message = conversation.messages.find((m) => m.id === messageId && m.role === "assistant");
    if (!message?.pendingApproval || this.isBusy(conversation.id)) return;
    for (const call of (message.tools || []).filter((c) => c.waiting && denied.includes(c.name))) {
      Object.assign(call, { result: `The user denied running ${call.name}.`, isError: true });
      delete call.waiting;
    }
    conversation.leaf = messageId;
    const history = this.#history(pathOf(conversation), conversation.preset);
    const key = `${conversation.id}::${model}`;
    // the resumed stream numbers its calls from 0 again: they go after this message's
    message.toolBase = (message.tools || []).length;
    Object.assign(message, { status: "streaming", stream: { key, offset: 0, completionId: null } });
    for (const field of ["pendingApproval", "finishReason", "error"]) delete message[field];
    conversation.updatedAt = Date.now();
    await this.#start(conversation, message, model, history);
  }

  /** Show another version: the branch through `messageId`, down to its newest last message. */
  async switchTo(conversation, messageId) {
    const message = conversation.messages.find((m) => m.id === messageId);
    if (!message || this.isBusy(conversation.id)) return;
    conversation.leaf = lastLeafUnder(conversation, message).id;
    await this.store.put(conversation);
  }

  /** Delete a message and everything under it; the shown branch moves to a sibling (else the parent). */
  async deleteBranch(conversation, messageId) {
    const message = conversation.messages.find((m) => m.id === messageId);
    if (!message || this.isBusy(conversation.id)) return;
    const gone = subtreeIds(conversation, message);
    const siblings = siblingsOf(conversation, message);
    const at = siblings.indexOf(message);
    const next = siblings[at - 1] || siblings[at + 1];
    const parent = conversation.messages.find((m) => m.id === message.parent);
    conversation.messages = conversation.messages.filter((m) => !gone.has(m.id));
    if (gone.has(conversation.leaf)) {
      conversation.leaf = next ? lastLeafUnder(conversation, next).id : (parent?.id ?? null);
    }
    conversation.updatedAt = Date.now();
    await this.store.put(conversation);
  }

  /** Add `message` after `parent` (default: the shown branch's last message); it is the new leaf. */
  #append(conversation, message, parent = undefined) {
    normalize(conversation);
    message.parent = (parent === undefined ? conversation.leaf : parent) ?? null;
    conversation.messages.push(message);
    conversation.leaf = message.id;
  }

  async #answer(conversation, model) {
    const history = this.#history(pathOf(conversation), conversation.preset);
    const key = `${conversation.id}::${model}`;
    const reply = {
      id: newId(),
      role: "assistant",
      content: "",
      reasoning: "",
      status: "streaming",
      model,
      createdAt: Date.now(),
      stream: { key, offset: 0, completionId: null },
    };
    this.#append(conversation, reply);
    conversation.updatedAt = Date.now();
    await this.#start(conversation, reply, model, history);
  }

  async #start(conversation, reply, model, history, extra = {}) {
    const run = this.#begin(conversation, reply);
    await this.store.put(conversation); // the stream state is on disk before the request leaves
    // The conversation's preset over the settings; custom JSON fields last, but never the messages or
    // the stream switch this page needs.
    const preset = conversation.preset || null;
    const body = {
      model,
      reasoning_control: true,
      ...this.settings.sampling(preset),
      ...this.#tools(conversation),
      ...this.settings.custom(preset),
      messages: history,
      stream: true,
      ...extra,
    };
    let response;
    try {
      response = await this.api.chat(body, reply.stream.key, run.abort.signal);
    } catch (err) {
      if (!run.stopped) await this.#resume(run); // the server may have it: ask the session
      return;
    }
    if (!response.ok) {
      this.#finish(run, "error", await errorMessage(response));
      return;
    }
    await this.#follow(run, response);
  }

  /** The MCP servers switched on for the conversation, as `mcp` tools the server runs itself. */
  #tools(conversation) {
    const servers = conversation.mcpServers || [];
    if (!servers.length) return {};
    const fields = this.toolsFor
      ? this.toolsFor(conversation)
      : { tools: servers.map((label) => ({ type: "mcp", server_label: label })) };
    if (!fields.tools?.length) return {};
    const rounds = this.settings.value("maxToolRounds", conversation.preset);
    return rounds ? { ...fields, max_tool_rounds: rounds } : fields;
  }

  /** Stop: end the session on the server (frees the slot), then drop our request; keep the partial text. */
  async stop(conversationId) {
    const run = this.runs.get(conversationId);
    if (!run) return;
    run.stopped = true;
    try {
      await this.api.stop(run.message.stream.key);
    } catch {
      /* offline: the session ends by itself when its TTL runs out */
    }
    run.abort.abort();
    this.#finish(run, "stopped");
  }

  /** Ask the server to end the reasoning now; the answer follows in the same stream. */
  async skipThinking(conversationId) {
    const run = this.runs.get(conversationId);
    const id = run?.message.stream?.completionId;
    if (!id) return;
    run.skipRequested = true;
    this.onUpdate(run.conversation, run.message);
    try {
      await this.api.control(id, "reasoning_end");
    } catch (err) {
      run.skipRequested = false;
      this.onUpdate(run.conversation, run.message);
      throw err;
    }
  }

  /** Resume every saved stream that is not followed yet (at start-up and when the tab is shown again). */
  resumeAll() {
    for (const { conversation, message } of this.store.pendingStreams()) {
      if (this.runs.has(conversation.id)) continue;
      const run = this.#begin(conversation, message);
      this.#resume(run);
    }
  }

  // -- internals ---------------------------------------------------------------------------------------
  /** The request's messages for a branch (its path): only that branch's messages. */
  #history(path, preset = null) {
    const messages = [];
    const system = (this.settings.value("systemPrompt", preset) || "").trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of path) {
      // a paused answer last: the request ends in its waiting calls (its text went with them)
      const paused = m === path.at(-1) && m.role === "assistant" && Boolean(m.pendingApproval?.length);
      if (m.role === "assistant") messages.push(...toolTurns(m, paused));
      if (paused) continue;
      if (m.role === "user" && (m.images?.some((image) => image.url) || m.files?.length))
        messages.push({ role: "user", content: contentParts(m) });
      else if ((m.role === "user" || m.role === "assistant") && m.content)
        messages.push({ role: m.role, content: m.content });
    }
    return messages;
  }

  #begin(conversation, message) {
    const run = { conversation, message, abort: new AbortController(), stopped: false, finished: false };
    run.skipRequested = false;
    run.saveTimer = null;
    this.runs.set(conversation.id, run);
    return run;
  }

  /** Read a 200 response to its end. Then: [DONE] finishes; anything else resumes from the offset. */
  async #follow(run, response) {
    this.#setStatus(run, "streaming");
    const outcome = await this.#read(run, response);
    if (run.stopped || run.finished) return;
    if (outcome.done) this.#finish(run, run.message.error ? "error" : "done");
    else await this.#resume(run, outcome.empty);
  }

  /** #consume, with a failed read (network gone) reported as neither done nor a clean empty end. */
  async #read(run, response) {
    try {
      const { done, bytes } = await this.#consume(run, response);
      return { done, empty: !done && bytes === 0 };
    } catch {
      return { done: false, empty: false };
    }
  }

  async #consume(run, response) {
    const reader = response.body.getReader();
    const splitter = new SseSplitter();
    let bytes = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done || run.stopped) return { done: false, bytes };
      for (const event of splitter.push(value)) {
        if (run.stopped) return { done: false, bytes };
        run.message.stream.offset += event.bytes;
        bytes += event.bytes;
        if (this.#apply(run, event.text)) return { done: true, bytes };
      }
      this.#saveSoon(run);
      this.onUpdate(run.conversation, run.message);
    }
  }

  /** Apply one SSE event to the message; true on [DONE]. */
  #apply(run, text) {
    const message = run.message;
    for (const line of text.split("\n")) {
      if (line.startsWith("error:")) {
        message.error = parseError(line.slice(6)) || "The server reported an error.";
        continue;
      }
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") return true;
      let payload;
      try {
        payload = JSON.parse(data);
      } catch {
        continue;
      }
      this.#applyChunk(run, payload);
    }
    return false;
  }

  #applyChunk(run, payload) {
    const message = run.message;
    if (payload.error) message.error = payload.error.message || String(payload.error);
    if (payload.id && !message.stream.completionId) message.stream.completionId = payload.id;
    if (payload.timings) message.timings = payload.timings;
    const choice = payload.choices?.[0];
    const delta = choice?.delta || {};
    if (delta.role === "tool") return applyToolResult(message, delta);
    if (delta.role === "assistant") message.round = (message.round ?? -1) + 1;
    for (const step of delta.tool_calls || []) applyToolStep(message, step, message.toolBase || 0);
    if (delta.reasoning_content) {
      message.thinkingStartedAt ??= Date.now();
      message.reasoning = (message.reasoning || "") + delta.reasoning_content;
    }
    if (delta.content) {
      this.#endThinking(message);
      message.content += delta.content;
    }
    if (choice?.finish_reason) message.finishReason = choice.finish_reason;
    if (choice?.pending_approval?.length) markWaiting(message, choice.pending_approval);
  }

  #endThinking(message) {
    if (message.thinkingStartedAt && message.thinkingMs === undefined) {
      message.thinkingMs = Date.now() - message.thinkingStartedAt;
    }
  }

  /** Probe the session until it can be followed (200), retrying every 2 s on 503 or no network.
   * A session stopped elsewhere ends without [DONE]: two clean, empty follows in a row mean just that. */
  async #resume(run, lastFollowWasEmpty = false) {
    let emptyBefore = lastFollowWasEmpty;
    while (!run.stopped && !run.finished) {
      this.#setStatus(run, run.message.status === "loading" ? "loading" : "resuming");
      let response;
      try {
        response = await this.api.stream(run.message.stream.key, run.message.stream.offset, run.abort.signal);
      } catch {
        if (run.stopped) return;
        await sleep(RETRY_MS);
        continue;
      }
      if (response.status === 200) {
        this.#setStatus(run, "streaming");
        const outcome = await this.#read(run, response);
        if (run.stopped || run.finished) return;
        if (outcome.done) return this.#finish(run, run.message.error ? "error" : "done");
        if (outcome.empty && emptyBefore) return this.#finish(run, "stopped");
        emptyBefore = outcome.empty;
        continue;
      }
      if (response.status === 503) {
        this.#setStatus(run, "loading");
        await sleep(RETRY_MS);
        continue;
      }
      const reason = response.status === 404 ? "" : await errorMessage(response);
      return this.#finish(run, "lost", reason);
    }
  }

  #setStatus(run, status) {
    if (run.message.status === status) return;
    run.message.status = status;
    this.onUpdate(run.conversation, run.message);
  }

  #saveSoon(run) {
    if (run.saveTimer) return;
    run.saveTimer = setTimeout(() => {
      run.saveTimer = null;
      if (!run.finished) this.store.put(run.conversation);
    }, SAVE_EVERY_MS);
  }

  #finish(run, status, error = "") {
    if (run.finished) return;
    run.finished = true;
    clearTimeout(run.saveTimer);
    const message = run.message;
    this.#endThinking(message);
    message.status = status;
    if (error) message.error = error;
    delete message.stream;
    // a resumed answer cut before its calls ran: they wait for nobody now (no result, not resent)
    if (!message.pendingApproval) for (const call of message.tools || []) delete call.waiting;
    run.conversation.updatedAt = Date.now();
    if (this.runs.get(run.conversation.id) === run) this.runs.delete(run.conversation.id);
    this.store.put(run.conversation);
    this.onUpdate(run.conversation, message);
  }
}

/** A user message with attachments as OpenAI content parts: the media first (an image as an
 * `image_url` part with its data: URL, an audio file as an `input_audio` part with its bare base64), then
 * the question about them, then each text file or PDF as a text part of its own, its name in a header
 * line and its text after it (llama.cpp's web UI's layout). Every later turn sends them again, the same
 * bytes in the same place: the server's prompt cache then reuses the cells it filled with them. */
function contentParts(message) {
  const stored = (message.images || []).filter((image) => image.url); // one lost from storage has no URL
  const parts = stored.map((item) =>
    item.kind === "audio"
      ? { type: "input_audio", input_audio: { data: base64Of(item.url), format: item.format || "wav" } }
      : { type: "image_url", image_url: { url: item.url } },
  );
  if (message.content) parts.push({ type: "text", text: message.content });
  for (const file of message.files || []) parts.push({ type: "text", text: fileText(file) });
  return parts;
}

/** A text file's or PDF's part: "--- File: name ---" (or "--- PDF File: name ---"), then its text. */
export function fileText(file) {
  const label = file.kind === "pdf" ? "PDF File" : "File";
  return `\n\n--- ${label}: ${file.name} ---\n${file.text}`;
}

/** The base64 of a data: URL, without its "data:...;base64," head (what `input_audio` takes). */
function base64Of(url) {
  return url.slice(url.indexOf(",") + 1);
}

// -- tool calls run by the server (the `mcp` tools) -------------------------------------------------
// message.tools holds each call in stream order: {id, name, arguments, round, result?, isError?}. Call
// indices run on across a run's rounds; each round opens with an assistant delta.
function applyToolStep(message, step, base) {
  message.tools ??= [];
  const call = (message.tools[base + step.index] ??= {
    id: "",
    name: "",
    arguments: "",
    round: message.round ?? 0,
  });
  if (step.id) call.id = step.id;
  if (step.function?.name) call.name += step.function.name;
  if (step.function?.arguments) call.arguments += step.function.arguments;
}

function applyToolResult(message, delta) {
  const call = (message.tools || []).find((c) => c.id === delta.tool_call_id);
  if (!call) return;
  call.result = delta.content ?? "";
  call.isError = Boolean(delta.is_error);
  delete call.waiting;
}

/** A paused answer (the stream's `pending_approval`: the tools that wait for the user): its last round's
 * calls, none run, wait for the user's decision. */
function markWaiting(message, names) {
  message.pendingApproval = [...names];
  const last = message.round ?? 0;
  for (const call of message.tools || []) {
    if (call.round === last && call.result === undefined) call.waiting = true;
  }
}

/** An answer's tool rounds as the messages the server added (assistant calls, then their results), so
 * the next request's prompt repeats this one's and its cached prefix is reused. Unanswered calls (a
 * stopped run) are left out, unless the answer is `paused` and they wait for the user (`waiting`): the
 * request then ends in them (with the answer's text so far), and the server runs those the user allowed. */
function toolTurns(message, paused = false) {
  const turns = [];
  const done = (message.tools || []).filter((c) => c.result !== undefined || (paused && c.waiting));
  for (const round of [...new Set(done.map((c) => c.round))]) {
    const calls = done.filter((c) => c.round === round);
    const waits = paused && calls.some((c) => c.waiting);
    turns.push({
      role: "assistant",
      content: waits && message.content ? message.content : null,
      tool_calls: calls.map((c) => ({
        id: c.id,
        type: "function",
        function: { name: c.name, arguments: c.arguments },
      })),
    });
    for (const c of calls.filter((call) => call.result !== undefined))
      turns.push({ role: "tool", tool_call_id: c.id, name: c.name, content: c.result });
  }
  return turns;
}

function parseError(text) {
  try {
    const body = JSON.parse(text);
    return body.error?.message || body.message || "";
  } catch {
    return text.trim();
  }
}
