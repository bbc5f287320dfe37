// Markdown -> DOM, safe by construction: every piece of the source becomes a text node or an element this
// file creates. No HTML is ever parsed, so `<script>` or `<img onerror=...>` from a model shows as text.
// Supports what chat models write: headings, paragraphs (single newlines kept as line breaks), emphasis,
// strike-through, inline code, fenced code blocks (with a copy button), lists (nested), block quotes,
// tables, rules, and links to http(s)/mailto URLs only.
import { h } from "./dom.js";
import { icon } from "./icons.js";

const FENCE = /^( {0,3})(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*))?$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}>[ ]?(.*)$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
const TABLE_SEP = /^ *\|? *:?-+:? *(?:\| *:?-+:? *)*\|? *$/;
const PUNCTUATION = /[!-/:-@[-`{-~]/;
const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;

/** Render `source` as a DocumentFragment. */
export function renderMarkdown(source) {
  const fragment = document.createDocumentFragment();
  const lines = String(source).replace(/\r\n?/g, "\n").replace(/\t/g, "    ").split("\n");
  renderBlocks(lines, fragment);
  return fragment;
}

function renderBlocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    if (!lines[i].trim()) {
      i += 1;
      continue;
    }
    let next = -1;
    for (const block of [fence, heading, rule, quote, list, table]) {
      next = block(lines, i, parent);
      if (next >= 0) break;
    }
    i = next >= 0 ? next : paragraph(lines, i, parent);
  }
}

function startsBlock(lines, i) {
  const line = lines[i];
  return (
    FENCE.test(line) ||
    HEADING.test(line) ||
    RULE.test(line) ||
    QUOTE.test(line) ||
    LIST_ITEM.test(line) ||
    isTableStart(lines, i)
  );
}

// -- blocks ------------------------------------------------------------------------------------------
function fence(lines, i, parent) {
  const open = FENCE.exec(lines[i]);
  if (!open || (open[2][0] === "`" && open[3].includes("`"))) return -1;
  const [, indent, marker, info] = open;
  const closing = new RegExp(`^ {0,3}${marker[0] === "`" ? "`" : "~"}{${marker.length},}[ ]*$`);
  const body = [];
  let j = i + 1;
  while (j < lines.length && !closing.test(lines[j])) {
    body.push(lines[j].startsWith(indent) ? lines[j].slice(indent.length) : lines[j].trimStart());
    j += 1;
  }
  parent.append(codeBlock(body.join("\n"), info.trim().split(/\s+/)[0] || ""));
  return Math.min(j + 1, lines.length);
}

/** A code block: its language, a copy button (handled by delegation on .copy-code), the code as text. */
export function codeBlock(code, language) {
  const copy = h(
    "button",
    { type: "button", class: "copy-code", "aria-label": "Copy code" },
    icon("copy", 14),
    "Copy",
  );
  const head = h("div", { class: "code-head" }, h("span", { class: "code-lang" }, language || "text"), copy);
  const codeEl = h("code", language ? { class: `language-${language}` } : {}, code);
  return h("div", { class: "code-block" }, head, h("pre", { tabindex: "0" }, codeEl));
}

function heading(lines, i, parent) {
  const m = HEADING.exec(lines[i]);
  if (!m) return -1;
  const text = (m[2] || "")
    .replace(/[ \t]+#+[ \t]*$/, "")
    .replace(/^#+$/, "")
    .trim();
  parent.append(inline(text, h(`h${m[1].length}`)));
  return i + 1;
}

function rule(lines, i, parent) {
  if (!RULE.test(lines[i])) return -1;
  parent.append(h("hr"));
  return i + 1;
}

function quote(lines, i, parent) {
  if (!QUOTE.test(lines[i])) return -1;
  const body = [];
  let j = i;
  for (let m; j < lines.length && (m = QUOTE.exec(lines[j])); j += 1) body.push(m[1]);
  const el = h("blockquote");
  renderBlocks(body, el);
  parent.append(el);
  return j;
}

function list(lines, i, parent) {
  const first = LIST_ITEM.exec(lines[i]);
  if (!first || RULE.test(lines[i])) return -1;
  const ordered = /\d/.test(first[2]);
  const el = h(ordered ? "ol" : "ul");
  const start = parseInt(first[2], 10);
  if (ordered && start !== 1) el.setAttribute("start", String(start));
  let j = i;
  let previousIndent = Infinity;
  while (j < lines.length) {
    const m = LIST_ITEM.exec(lines[j]);
    if (!m || /\d/.test(m[2]) !== ordered || m[1].length >= previousIndent || RULE.test(lines[j])) break;
    const contentIndent = m[1].length + m[2].length + Math.min((m[3] || " ").length, 4);
    const item = listItem(lines, j, contentIndent);
    el.append(item.node);
    j = siblingAfterBlanks(lines, item.end, m[1].length, ordered);
    previousIndent = contentIndent;
  }
  parent.append(el);
  return j;
}

function listItem(lines, i, contentIndent) {
  const body = [LIST_ITEM.exec(lines[i])[4] || ""];
  let j = i + 1;
  while (j < lines.length) {
    const line = lines[j];
    if (!line.trim()) {
      let k = j;
      while (k < lines.length && !lines[k].trim()) k += 1;
      if (k >= lines.length || indentOf(lines[k]) < contentIndent) break;
      body.push(...lines.slice(j, k).map(() => ""));
      j = k;
      continue;
    }
    const indent = indentOf(line);
    if (indent >= contentIndent) body.push(line.slice(contentIndent));
    else if (LIST_ITEM.test(line) && indent > indentOf(lines[i])) body.push(line.trimStart());
    else if (!startsBlock(lines, j) && body[body.length - 1].trim()) body.push(line.trim());
    else break;
    j += 1;
  }
  const node = h("li");
  renderBlocks(body, node);
  return { node, end: j };
}

/** Skip blank lines between two items of the same list, so "1. a\n\n2. b" stays one list. */
function siblingAfterBlanks(lines, j, indent, ordered) {
  let k = j;
  while (k < lines.length && !lines[k].trim()) k += 1;
  const m = k < lines.length ? LIST_ITEM.exec(lines[k]) : null;
  return m && m[1].length === indent && /\d/.test(m[2]) === ordered ? k : j;
}

function indentOf(line) {
  return line.length - line.trimStart().length;
}

function isTableStart(lines, i) {
  return (
    i + 1 < lines.length &&
    lines[i].includes("|") &&
    lines[i + 1].includes("|") &&
    TABLE_SEP.test(lines[i + 1])
  );
}

function table(lines, i, parent) {
  if (!isTableStart(lines, i)) return -1;
  const aligns = cells(lines[i + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : "",
  );
  const row = (line, tag) =>
    h(
      "tr",
      {},
      aligns.map((align, k) =>
        inline(cells(line)[k] || "", h(tag, align ? { class: `align-${align}` } : {})),
      ),
    );
  const head = h("thead", {}, row(lines[i], "th"));
  const body = h("tbody");
  let j = i + 2;
  for (; j < lines.length && lines[j].includes("|") && lines[j].trim(); j += 1)
    body.append(row(lines[j], "td"));
  parent.append(h("div", { class: "table-wrap" }, h("table", {}, head, body)));
  return j;
}

function cells(line) {
  const trimmed = line
    .trim()
    .replace(/^\|/, "")
    .replace(/(?<!\\)\|$/, "");
  return trimmed.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

function paragraph(lines, i, parent) {
  const body = [lines[i].trim()];
  let j = i + 1;
  while (j < lines.length && lines[j].trim() && !startsBlock(lines, j)) {
    body.push(lines[j].trim());
    j += 1;
  }
  parent.append(inline(body.join("\n"), h("p")));
  return j;
}

// -- inlines -----------------------------------------------------------------------------------------
/** Append the inline content of `text` to `parent` and return `parent`. */
function inline(text, parent) {
  let buffer = "";
  const flush = () => {
    if (buffer) parent.append(document.createTextNode(buffer));
    buffer = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "\\" && i + 1 < text.length && PUNCTUATION.test(text[i + 1])) {
      buffer += text[i + 1];
      i += 2;
      continue;
    }
    const found = c === "\n" ? { node: h("br"), end: i + 1 } : special(text, i);
    if (found) {
      flush();
      parent.append(found.node);
      i = found.end;
    } else {
      const run = c === "`" ? runLength(text, i, "`") : 1; // an unmatched backtick run stays literal whole
      buffer += text.slice(i, i + run);
      i += run;
    }
  }
  flush();
  return parent;
}

function special(text, i) {
  switch (text[i]) {
    case "`":
      return codeSpan(text, i);
    case "*":
    case "_":
    case "~":
      return emphasis(text, i);
    case "[":
      return link(text, i, false);
    case "!":
      return text[i + 1] === "[" ? link(text, i + 1, true) : null;
    case "<":
      return angleLink(text, i);
    case "h":
      return bareLink(text, i);
    default:
      return null;
  }
}

function runLength(text, i, c) {
  let n = 0;
  while (text[i + n] === c) n += 1;
  return n;
}

function codeSpan(text, i) {
  const n = runLength(text, i, "`");
  let j = i + n;
  while ((j = text.indexOf("`", j)) >= 0) {
    const m = runLength(text, j, "`");
    if (m === n) {
      let code = text.slice(i + n, j).replace(/\n/g, " ");
      if (/^ .*[^ ].* $/.test(code)) code = code.slice(1, -1);
      return { node: h("code", {}, code), end: j + n };
    }
    j += m;
  }
  return null;
}

function emphasis(text, i) {
  const c = text[i];
  const n = runLength(text, i, c);
  if (c === "_" && i > 0 && /[\p{L}\p{N}]/u.test(text[i - 1])) return null; // snake_case stays as is
  if (!text[i + n] || /\s/.test(text[i + n])) return null;
  const lengths = c === "~" ? (n === 2 ? [2] : []) : [3, 2, 1].filter((len) => len <= n);
  for (const len of lengths) {
    const close = closingMarker(text, i + len, c, len);
    if (close < 0) continue;
    const inner = text.slice(i + len, close);
    const node = c === "~" ? h("del") : len === 1 ? h("em") : h("strong");
    if (len === 3) node.append(inline(inner, h("em")));
    else inline(inner, node);
    return { node, end: close + len };
  }
  return null;
}

function closingMarker(text, from, c, len) {
  const marker = c.repeat(len);
  for (let j = text.indexOf(marker, from + 1); j >= 0; j = text.indexOf(marker, j + 1)) {
    const before = text[j - 1];
    const after = text[j + len] || "";
    if (/\s/.test(before) || before === c || after === c) continue;
    if (c === "_" && /[\p{L}\p{N}]/u.test(after)) continue;
    return j;
  }
  return -1;
}

function link(text, i, isImage) {
  let depth = 0;
  let j = i;
  for (; j < text.length; j += 1) {
    if (text[j] === "\\") j += 1;
    else if (text[j] === "[") depth += 1;
    else if (text[j] === "]" && --depth === 0) break;
  }
  if (j >= text.length) return null;
  const target = /^\(\s*<?((?:[^\s()<>]|\([^\s()<>]*\))*)>?(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)/.exec(
    text.slice(j + 1),
  );
  if (!target) return null;
  const label = text.slice(i + 1, j);
  const node = anchor(target[1], isImage ? `${label || "image"} (image)` : null);
  if (!isImage) inline(label, node);
  return { node, end: j + 1 + target[0].length };
}

/** A link to `url` if it is http(s) or mailto; else its label as plain text in a span. */
function anchor(url, text) {
  const safe = SAFE_URL.test(url);
  const node = safe
    ? h("a", { href: url, target: "_blank", rel: "noopener noreferrer nofollow" })
    : h("span");
  if (text !== null) node.append(text);
  return node;
}

function angleLink(text, i) {
  const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(text.slice(i));
  return m ? { node: anchor(m[1], m[1]), end: i + m[0].length } : null;
}

function bareLink(text, i) {
  if (i > 0 && /[\p{L}\p{N}_/]/u.test(text[i - 1])) return null;
  const m = /^https?:\/\/[^\s<>"'`]+/i.exec(text.slice(i));
  if (!m) return null;
  let url = m[0].replace(/[.,;:!?*_~]+$/, "");
  while (url.endsWith(")") && url.split("(").length < url.split(")").length) url = url.slice(0, -1);
  return { node: anchor(url, url), end: i + url.length };
}
