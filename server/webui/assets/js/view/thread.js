// The open conversation's shown branch (tree.js): its messages, the thinking block, tool calls, status
// and stats; redrawn per animation frame. Edit (a user message: a new version of it), Regenerate (an
// answer: a new version), Continue (a cut answer), Delete (a message and what follows it) and the
// `< 2/3 >` switch between a message's versions hand their work to the app.
import { copyText, h } from "../dom.js";
import { icon } from "../icons.js";
import { renderMarkdown } from "../markdown.js";
import { normalize, pathOf, siblingsOf } from "../tree.js";
import { audioChip, fileChip } from "./attachments.js";

const STATUS_TEXT = {
  streaming: "Streaming",
  resuming: "Resuming…",
  loading: "Server loading…",
  stopped: "Stopped",
  lost: "Lost: partial answer kept",
  error: "Error",
};

const SUGGESTIONS = [
  "Explain what a KV cache is, in three sentences.",
  "Write a haiku about a llama in the Andes.",
  "Show a Python function that checks whether a word is a palindrome.",
];

export class Thread {
  /** `chat` answers isBusy/isThinking; `onSkip(conversationId)` runs the Skip thinking button;
   * `onEdit(messageId, text)` sends a new version of a user message; `onRegenerate(messageId)` a new
   * answer beside that one; `onContinue(messageId)` continues a cut answer; `onSwitch(messageId)` shows
   * that version's branch; `onDelete(messageId)` deletes the message and what follows it. */
  constructor({ scroller, root, chat, onSkip, onSuggestion, onEdit, onRegenerate, onContinue, onSwitch, onDelete }) {
    this.scroller = scroller;
    this.root = root;
    this.chat = chat;
    this.onSkip = onSkip;
    this.onSuggestion = onSuggestion;
    this.actions = { onEdit, onRegenerate, onContinue, onSwitch, onDelete };
    this.conversation = null;
    this.path = [];
    this.views = new Map(); // message id -> MessageView
    this.dirty = new Set();
    this.frame = 0;
    root.addEventListener("click", (event) => this.#onClick(event));
  }

  show(conversation, model) {
    this.conversation = conversation;
    this.views.clear();
    this.dirty.clear();
    if (conversation) normalize(conversation);
    const messages = (this.path = pathOf(conversation));
    if (!messages.length) {
      this.root.replaceChildren(this.#welcome(model));
      return;
    }
    this.root.replaceChildren(...messages.map((m) => this.#viewOf(m).el));
    for (const view of this.views.values()) view.render(this.#state(view.message));
    this.wasBusy = this.chat.isBusy(conversation.id);
    this.scrollToEnd();
  }

  /** A message changed: redraw it on the next frame (appending it if it is new). */
  update(conversation, message) {
    if (conversation !== this.conversation) return;
    if (!this.views.has(message.id)) {
      // a new message of the shown branch; one of another branch is not drawn
      if (pathOf(conversation).includes(message)) this.show(conversation);
      return;
    }
    this.dirty.add(message.id);
    this.frame ||= requestAnimationFrame(() => this.#flush());
  }

  scrollToEnd() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  #flush() {
    this.frame = 0;
    const pinned = this.scroller.scrollHeight - this.scroller.scrollTop - this.scroller.clientHeight < 120;
    // an answer started or ended: every message's actions show or hide with it
    const busy = this.chat.isBusy(this.conversation?.id);
    if (busy !== this.wasBusy) for (const id of this.views.keys()) this.dirty.add(id);
    this.wasBusy = busy;
    for (const id of this.dirty) {
      const view = this.views.get(id);
      if (view) view.render(this.#state(view.message));
    }
    this.dirty.clear();
    if (pinned) this.scrollToEnd();
  }

  #state(message) {
    const id = this.conversation?.id;
    const last = this.path.at(-1) === message;
    const busy = this.chat.isBusy(id);
    const siblings = this.conversation ? siblingsOf(this.conversation, message) : [message];
    return {
      last,
      busy,
      live: last && busy,
      thinking: last && this.chat.isThinking(id),
      versions: { index: siblings.indexOf(message), count: siblings.length, siblings },
    };
  }

  #viewOf(message) {
    const a = this.actions;
    const common = {
      onSwitch: (sibling) => a.onSwitch(sibling.id),
      onDelete: () => a.onDelete(message.id),
    };
    const view =
      message.role === "user"
        ? new UserView(message, { ...common, onEdit: (text) => a.onEdit(message.id, text) })
        : new AssistantView(message, {
            ...common,
            onSkip: () => this.onSkip(this.conversation.id),
            onRegenerate: () => a.onRegenerate(message.id),
            onContinue: () => a.onContinue(message.id),
          });
    this.views.set(message.id, view);
    return view;
  }

  #welcome(model) {
    const chips = SUGGESTIONS.map((text) =>
      h("button", { type: "button", class: "suggestion", onclick: () => this.onSuggestion(text) }, text),
    );
    return h(
      "div",
      { class: "welcome" },
      h("img", { src: "/assets/favicon.svg", alt: "", width: 56, height: 56, class: "welcome-logo" }),
      h("h2", {}, "How can I help you today?"),
      h(
        "p",
        { class: "welcome-sub" },
        model ? `You are chatting with ${model}, served by Llamba.` : "Llamba is starting…",
      ),
      h("div", { class: "suggestions" }, chips),
    );
  }

  async #onClick(event) {
    const button = event.target.closest("button.copy-code, button.copy-message");
    if (!button) return;
    const text = button.classList.contains("copy-code")
      ? button.closest(".code-block").querySelector("code").textContent
      : this.views.get(button.closest(".msg").dataset.id)?.message.content || "";
    if (await copyText(text)) flash(button);
  }
}

function flash(button) {
  const label = button.getAttribute("aria-label");
  button.classList.add("copied");
  button.setAttribute("aria-label", "Copied");
  setTimeout(() => {
    button.classList.remove("copied");
    button.setAttribute("aria-label", label);
  }, 1500);
}

/** `< 2/3 >`: a message's versions (its siblings in the tree); empty (no text at all) for one version. */
class Versions {
  constructor(onSwitch) {
    this.onSwitch = onSwitch;
    this.el = h("div", { class: "versions", role: "group", "aria-label": "Versions", hidden: true });
    this.shown = "";
  }

  render({ index, count, siblings }, busy) {
    const key = `${index}/${count}/${busy}`;
    this.el.hidden = count < 2;
    if (key === this.shown) return;
    this.shown = key;
    if (count < 2) {
      this.el.replaceChildren();
      return;
    }
    const go = (to) => () => this.onSwitch(siblings[to]);
    const button = (label, iconName, to) =>
      h(
        "button",
        {
          type: "button",
          class: "icon-button small",
          "aria-label": label,
          disabled: busy || to < 0 || to >= count,
          onclick: go(to),
        },
        icon(iconName, 14),
      );
    this.el.replaceChildren(
      button("Previous version", "left", index - 1),
      h("span", { class: "versions-count" }, `${index + 1}/${count}`),
      button("Next version", "right", index + 1),
    );
  }
}

function deleteButton(onDelete) {
  return h(
    "button",
    {
      type: "button",
      class: "icon-button small delete-message",
      "aria-label": "Delete message",
      title: "Delete this message and everything after it",
      onclick: () => confirm("Delete this message and everything after it?") && onDelete(),
    },
    icon("trash", 15),
  );
}

class UserView {
  constructor(message, { onEdit, onSwitch, onDelete }) {
    this.message = message;
    this.onEdit = onEdit;
    this.bubble = h("div", { class: "bubble" });
    this.images = h("div", { class: "msg-images", hidden: true });
    this.files = h("div", { class: "msg-files", hidden: true });
    this.shownImages = null; // the images array drawn in this.images (they never change once sent)
    this.versions = new Versions(onSwitch);
    this.delete = deleteButton(onDelete);
    const edit = (this.edit = h(
      "button",
      {
        type: "button",
        class: "icon-button small edit-message",
        "aria-label": "Edit message",
        onclick: () => this.#startEdit(),
      },
      icon("pencil", 15),
    ));
    this.body = h(
      "div",
      { class: "user-body" },
      this.images,
      this.files,
      this.bubble,
      h("div", { class: "user-tools" }, this.versions.el, edit, this.delete),
    );
    this.el = h(
      "article",
      { class: "msg user", dataset: { id: message.id }, "aria-label": "You" },
      this.body,
    );
  }

  render({ versions, busy } = {}) {
    if (versions) this.versions.render(versions, busy);
    this.edit.hidden = this.delete.hidden = Boolean(busy);
    const files = this.message.files || [];
    if (this.shownFiles !== files) {
      this.shownFiles = files;
      this.files.hidden = !files.length;
      this.files.replaceChildren(...files.map((file) => fileChip(file)));
    }
    const images = this.message.images || [];
    if (this.shownImages !== images) {
      this.shownImages = images;
      this.images.hidden = !images.length;
      this.images.replaceChildren(
        ...images.map((image) =>
          image.kind === "audio"
            ? audioChip(image.name)
            : h("img", { class: "msg-image", src: image.url || null, alt: image.name, title: image.name }),
        ),
      );
    }
    this.bubble.hidden = !this.message.content; // a message may be images or audio alone
    this.bubble.textContent = this.message.content;
  }

  /** The message in a text box; Submit edit resends it (the answers after it are replaced). */
  #startEdit() {
    const box = h("textarea", { class: "edit-box", "aria-label": "Edit message text", rows: 3 });
    box.value = this.message.content;
    const cancel = () => form.replaceWith(this.body);
    const form = h(
      "form",
      {
        class: "edit-form",
        onsubmit: (event) => {
          event.preventDefault();
          const text = box.value.trim();
          if (text) this.onEdit(text);
        },
      },
      box,
      h(
        "div",
        { class: "edit-actions" },
        h("button", { type: "button", class: "button ghost small", onclick: cancel }, "Cancel edit"),
        h("button", { type: "submit", class: "button primary small" }, "Submit edit"),
      ),
    );
    box.addEventListener("keydown", (event) => {
      if (event.key === "Escape") cancel();
    });
    this.body.replaceWith(form);
    box.focus();
  }
}

/** One tool call the server ran: its name and state; opened, its arguments and result (as text). */
class ToolBlock {
  constructor() {
    this.name = h("span", { class: "tool-name" });
    this.state = h("span", { class: "tool-state" });
    this.args = h("pre", { class: "tool-text" });
    this.resultHead = h("p", { class: "tool-head" }, "Result");
    this.result = h("pre", { class: "tool-text tool-result" });
    this.el = h(
      "details",
      { class: "tool-call" },
      h("summary", {}, icon("tool", 15), this.name, this.state),
      h(
        "div",
        { class: "tool-body" },
        h("p", { class: "tool-head" }, "Arguments"),
        this.args,
        this.resultHead,
        this.result,
      ),
    );
  }

  update(call, live) {
    const pending = call.result === undefined;
    this.el.setAttribute("aria-label", `Tool call ${call.name}`);
    this.el.classList.toggle("is-error", Boolean(call.isError));
    this.name.textContent = call.name;
    const idle = call.waiting ? "Waits for your approval" : "No result";
    this.state.textContent = pending ? (live ? "Running…" : idle) : call.isError ? "Error" : "Done";
    this.args.textContent = pretty(call.arguments);
    this.resultHead.hidden = this.result.hidden = pending;
    this.result.textContent = call.result ?? "";
  }
}

function pretty(json) {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return json;
  }
}

class AssistantView {
  constructor(message, { onSkip, onRegenerate, onContinue, onSwitch, onDelete }) {
    this.message = message;
    this.status = h("span", { class: "status", hidden: true });
    this.summaryLabel = h("span", { class: "thinking-label" });
    this.reasoning = h("div", { class: "thinking-body" });
    this.details = h(
      "details",
      { class: "thinking" },
      h("summary", {}, icon("bulb", 16), this.summaryLabel),
      this.reasoning,
    );
    // A toggle that does not match what render() asked for is the user's: from then on the block is theirs.
    this.details.addEventListener("toggle", () => {
      if (this.details.open !== this.autoOpen) this.userToggled = true;
    });
    this.skip = h(
      "button",
      { type: "button", class: "button small skip", hidden: true, onclick: onSkip },
      icon("skip", 14),
      "Skip thinking",
    );
    this.thinking = h("div", { class: "thinking-wrap", hidden: true }, this.details, this.skip);
    this.toolBox = h("div", { class: "tool-calls", hidden: true });
    this.toolBlocks = [];
    this.content = h("div", { class: "content markdown" });
    this.typing = h(
      "div",
      { class: "typing", hidden: true, "aria-hidden": "true" },
      h("span"),
      h("span"),
      h("span"),
    );
    this.error = h("p", { class: "msg-error", hidden: true });
    this.stats = h("span", { class: "stats" });
    const copy = h(
      "button",
      { type: "button", class: "icon-button small copy-message", "aria-label": "Copy message" },
      icon("copy", 15),
    );
    this.regenerate = h(
      "button",
      { type: "button", class: "icon-button small", "aria-label": "Regenerate", onclick: onRegenerate },
      icon("refresh", 15),
    );
    this.continue = h(
      "button",
      { type: "button", class: "button ghost small continue", onclick: onContinue, hidden: true },
      icon("skip", 14),
      "Continue",
    );
    this.versions = new Versions(onSwitch);
    this.delete = deleteButton(onDelete);
    this.foot = h(
      "div",
      { class: "msg-foot" },
      this.stats,
      this.versions.el,
      copy,
      this.regenerate,
      this.continue,
      this.delete,
    );
    const meta = h(
      "div",
      { class: "msg-meta" },
      h("span", { class: "who" }, message.model || "Assistant"),
      this.status,
    );
    const main = h(
      "div",
      { class: "msg-main" },
      meta,
      this.thinking,
      this.toolBox,
      this.content,
      this.typing,
      this.error,
      this.foot,
    );
    const avatar = h("div", { class: "avatar", "aria-hidden": "true" }, icon("sparkle", 16));
    this.el = h(
      "article",
      { class: "msg assistant", dataset: { id: message.id }, "aria-label": "Assistant" },
      avatar,
      main,
    );
    this.renderedText = null;
    this.userToggled = false;
    this.autoOpen = false;
  }

  render({ live, thinking, last, busy, versions }) {
    const m = this.message;
    this.#renderThinking(m, live, thinking);
    this.#renderTools(m.tools || [], live);
    if (this.renderedText !== m.content) {
      this.content.replaceChildren(renderMarkdown(m.content));
      this.renderedText = m.content;
    }
    const status =
      m.status && STATUS_TEXT[m.status] && !(m.status === "streaming" && !live) ? m.status : null;
    this.status.hidden = !status;
    this.status.className = `status status-${status}`;
    this.status.textContent = status ? STATUS_TEXT[status] : "";
    this.el.dataset.status = m.status || "done";
    this.typing.hidden = !(live && !m.content && !m.reasoning && !m.tools?.length);
    this.error.hidden = !m.error;
    this.error.textContent = m.error || "";
    this.stats.textContent = statsText(m.timings);
    this.stats.title = statsTitle(m.timings);
    this.foot.hidden = live;
    this.versions.render(versions, busy);
    this.regenerate.hidden = this.delete.hidden = busy;
    // a cut answer: stopped, lost, or ended by its token limit
    const cut = m.finishReason === "length" || m.status === "stopped" || m.status === "lost";
    this.continue.hidden = busy || !last || !m.content || !cut;
  }

  #renderTools(calls, live) {
    this.toolBox.hidden = !calls.length;
    calls.forEach((call, i) => {
      if (!call) return;
      if (!this.toolBlocks[i]) {
        this.toolBlocks[i] = new ToolBlock();
        this.toolBox.append(this.toolBlocks[i].el);
      }
      this.toolBlocks[i].update(call, live);
    });
  }

  #renderThinking(m, live, thinking) {
    this.thinking.hidden = !m.reasoning;
    if (!m.reasoning) return;
    this.reasoning.textContent = m.reasoning;
    this.el.classList.toggle("is-thinking", thinking);
    this.skip.hidden = !thinking;
    const seconds = m.thinkingMs !== undefined ? (m.thinkingMs / 1000).toFixed(1) : null;
    this.summaryLabel.textContent =
      thinking || (live && !m.content) ? "Thinking…" : seconds ? `Thought for ${seconds} s` : "Thoughts";
    if (!this.userToggled) {
      this.autoOpen = thinking;
      this.details.open = thinking;
    }
  }
}

function statsText(t) {
  if (!t || !t.predicted_n) return "";
  const parts = [`${t.predicted_n} tokens`, `${(t.predicted_per_second || 0).toFixed(1)} tok/s`];
  if (t.prompt_ms !== undefined) parts.push(`${formatMs(t.prompt_ms)} to first token`);
  return parts.join(" · ");
}

function statsTitle(t) {
  if (!t) return "";
  const prompt = (t.prompt_n || 0) + (t.cache_n || 0);
  return `Prompt: ${prompt} tokens (${t.cache_n || 0} cached), ${(t.prompt_per_second || 0).toFixed(1)} tok/s`;
}

function formatMs(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}
