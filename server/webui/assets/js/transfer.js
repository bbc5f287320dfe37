// Export and import of conversations as JSON: {"format": "llamba.conversations", "version": 2, ...}.
//
// Version 2 (message trees): a conversation's `messages` are every message of every branch, each with
// its `parent` (the id of the message it follows, null for a first one), and `leaf` is the id of the
// shown branch's last message; a user message may carry `files` (text files and PDFs: {name, kind:
// "text" | "pdf", text}). Version 1 (no `leaf`, no `parent`) was one flat branch, and imports as one.
// Optional fields of a conversation (version 2 readers that do not know them drop them): `preset`, the
// preset picked for it ({name, values}: its settings by field name, settings.js), `toolsOff`, the tools
// switched off, and `approvedTools`, the writing tools the user allowed.
import { h, newId } from "./dom.js";
import { PRESET_FIELDS } from "./settings.js";
import { normalize } from "./tree.js";

export const FORMAT = "llamba.conversations";
export const VERSION = 2;

export function exportJson(conversations) {
  const data = {
    format: FORMAT,
    version: VERSION,
    exportedAt: new Date().toISOString(),
    conversations: conversations.map((c) => ({
      ...c,
      messages: c.messages.map(({ stream, ...message }) => message),
    })),
  };
  return JSON.stringify(data, null, 2);
}

export function download(text, filename) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
  const a = h("a", { href: url, download: filename, class: "sr-only" });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** Parse an export (or a bare array of conversations): only known fields of the right type are kept. */
export function parseImport(text) {
  const data = JSON.parse(text);
  const list = Array.isArray(data)
    ? data
    : data && Array.isArray(data.conversations)
      ? data.conversations
      : null;
  if (!list) throw new Error('not a conversations export: expected {"conversations": [...]}');
  return list.map(cleanConversation).filter(Boolean);
}

const str = (v, fallback = "") => (typeof v === "string" ? v : fallback);
const num = (v, fallback) => (Number.isFinite(v) ? v : fallback);

function cleanConversation(raw) {
  if (!raw || typeof raw !== "object" || !Array.isArray(raw.messages)) return null;
  const now = Date.now();
  const seen = new Set();
  const messages = raw.messages
    .map(cleanMessage)
    .filter((m) => m && !seen.has(m.id) && seen.add(m.id)); // an id twice would make the tree ambiguous
  const tree = typeof raw.leaf === "string" || raw.leaf === null;
  if (!tree) for (const m of messages) delete m.parent; // version 1: one branch, in order
  return normalize({
    id: str(raw.id) || newId(),
    title: str(raw.title).slice(0, 200) || "Imported chat",
    createdAt: num(raw.createdAt, now),
    updatedAt: num(raw.updatedAt, now),
    mcpServers: strings(raw.mcpServers),
    toolsOff: strings(raw.toolsOff),
    approvedTools: strings(raw.approvedTools),
    ...cleanPreset(raw.preset),
    messages,
    ...(tree ? { leaf: raw.leaf } : {}),
  });
}

function strings(v) {
  return Array.isArray(v) ? v.filter((s) => typeof s === "string") : [];
}

/** A conversation's preset: its name and the known fields of its values (numbers, strings, a samplers
 * list), as `{preset}`; {} when there is none. */
function cleanPreset(raw) {
  if (!raw || typeof raw !== "object" || typeof raw.name !== "string" || !raw.values) return {};
  const values = {};
  for (const name of PRESET_FIELDS) {
    const v = raw.values[name];
    if (Number.isFinite(v) || typeof v === "string") values[name] = v;
    else if (Array.isArray(v) && v.every((x) => typeof x === "string")) values[name] = v;
  }
  return { preset: { name: raw.name.slice(0, 100), values } };
}

function cleanMessage(raw) {
  if (!raw || typeof raw !== "object" || !["user", "assistant", "system"].includes(raw.role)) return null;
  const message = {
    id: str(raw.id) || newId(),
    role: raw.role,
    content: str(raw.content),
    createdAt: num(raw.createdAt, Date.now()),
    parent: typeof raw.parent === "string" ? raw.parent : null,
  };
  if (raw.reasoning) message.reasoning = str(raw.reasoning);
  if (raw.thinkingMs) message.thinkingMs = num(raw.thinkingMs, undefined);
  if (raw.status)
    message.status = ["streaming", "resuming", "loading"].includes(raw.status) ? "lost" : str(raw.status);
  if (raw.error) message.error = str(raw.error);
  if (raw.timings && typeof raw.timings === "object") message.timings = cleanTimings(raw.timings);
  if (Array.isArray(raw.tools))
    message.tools = raw.tools.filter((c) => c && typeof c === "object").map(cleanCall);
  const images = Array.isArray(raw.images) ? raw.images.map(cleanImage).filter(Boolean) : [];
  if (raw.role === "user" && images.length) message.images = images;
  const files = Array.isArray(raw.files) ? raw.files.map(cleanFile).filter(Boolean) : [];
  if (raw.role === "user" && files.length) message.files = files;
  if (raw.role === "assistant" && typeof raw.model === "string") message.model = raw.model;
  if (typeof raw.finishReason === "string") message.finishReason = raw.finishReason;
  const waiting = Array.isArray(raw.pendingApproval)
    ? raw.pendingApproval.filter((name) => typeof name === "string")
    : [];
  if (raw.role === "assistant" && waiting.length) message.pendingApproval = waiting;
  return message;
}

/** An attached text file or PDF: its name, kind and text (nothing else is kept). */
function cleanFile(raw) {
  if (!raw || typeof raw.text !== "string") return null;
  const kind = raw.kind === "pdf" ? "pdf" : "text";
  return { id: newId(), name: str(raw.name).slice(0, 200) || "file", kind, text: raw.text };
}

/** An attached image: data: URLs of images only (nothing an <img> would fetch from elsewhere), under a
 * fresh id, so an import never stands for an image another conversation stored under the same id. An
 * attached audio file (kind "audio"): a base64 data: URL (never shown, its base64 is sent), its format
 * one of wav, mp3, flac. */
function cleanImage(raw) {
  if (!raw || typeof raw.url !== "string") return null;
  const name = str(raw.name).slice(0, 200);
  if (raw.kind === "audio") {
    if (!/^data:[\w.+/-]*;base64,/.test(raw.url)) return null;
    const format = ["wav", "mp3", "flac"].includes(raw.format) ? raw.format : "wav";
    return { id: newId(), name: name || "audio", url: raw.url, kind: "audio", format };
  }
  if (!raw.url.startsWith("data:image/")) return null;
  return { id: newId(), name: name || "image", url: raw.url };
}

function cleanCall(raw) {
  const call = { id: str(raw.id), name: str(raw.name), arguments: str(raw.arguments) };
  call.round = num(raw.round, 0);
  if (typeof raw.result === "string") {
    call.result = raw.result;
    call.isError = raw.isError === true;
  } else if (raw.waiting === true) call.waiting = true;
  return call;
}

function cleanTimings(raw) {
  const out = {};
  for (const [k, v] of Object.entries(raw)) if (Number.isFinite(v)) out[k] = v;
  return out;
}
