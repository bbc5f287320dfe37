// Markdown -> DOM: marked (GFM, single newlines kept as line breaks) writes HTML, DOMPurify sanitises it
// into a fragment, then code blocks get their copy button and highlighting, math its KaTeX, ```mermaid
// its diagram (rich.js loads those three on first use). Raw HTML in an answer is shown as text (marked's
// html renderer escapes it), links go only to http(s)/mailto and open with rel=noopener, images are links:
// model output never becomes script, an element it chose, or a request the page makes by itself.
import { Marked } from "../vendor/marked/marked.esm.js";
import { h } from "./dom.js";
import { icon } from "./icons.js";
import { highlightCode, renderMath, renderMermaid, sanitize } from "./rich.js";

const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;
const CLOSED_FENCE = /\n {0,3}(`{3,}|~{3,})[ \t]*\n*$/;

const escapeHtml = (text) =>
  String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// $$..$$ and \[..\] on lines of their own: display math.
const mathBlock = {
  name: "mathBlock",
  level: "block",
  start: (src) => src.match(/^ {0,3}(?:\$\$|\\\[)/m)?.index,
  tokenizer(src) {
    const m = /^ {0,3}(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\])[ \t]*(?:\n+|$)/.exec(src);
    if (m) return { type: "mathBlock", raw: m[0], text: (m[1] ?? m[2]).trim(), display: true };
  },
  renderer: (token) => `<div class="math" data-display="1">${escapeHtml(token.text)}</div>\n`,
};

// $..$ and \(..\) in a line (and $$..$$ / \[..\] inside one, displayed). A `$` opens math only before a
// non-space and closes after one, not before a digit: "from $5 to $10" stays text (pandoc's rule).
const INLINE_MATH = [
  [/^\$\$((?:\\.|[^\\$])+?)\$\$/, true],
  [/^\\\[([\s\S]+?)\\\]/, true],
  [/^\\\(([\s\S]+?)\\\)/, false],
  [/^\$(?![\s$])((?:\\.|[^\\$\n])+?)(?<!\s)\$(?!\d)/, false],
];
const mathInline = {
  name: "mathInline",
  level: "inline",
  start: (src) => src.match(/\$|\\[([]/)?.index,
  tokenizer(src) {
    for (const [pattern, display] of INLINE_MATH) {
      const m = pattern.exec(src);
      if (m) return { type: "mathInline", raw: m[0], text: m[1].trim(), display };
    }
  },
  renderer: (token) =>
    `<span class="math" data-display="${token.display ? 1 : 0}">${escapeHtml(token.text)}</span>`,
};

const marked = new Marked({
  gfm: true,
  breaks: true,
  async: false,
  extensions: [mathBlock, mathInline],
  renderer: {
    // An answer's own HTML is text, block or inline: shown as written, never parsed.
    html: (token) => (token.block ? `<p>${escapeHtml(token.text.trim())}</p>` : escapeHtml(token.text)),
    code({ text, lang, raw }) {
      const language = (lang || "").trim().split(/\s+/)[0];
      const complete = CLOSED_FENCE.test(raw) || !/^ {0,3}(`{3,}|~{3,})/.test(raw); // indented: whole
      return `<pre data-lang="${escapeHtml(language)}" data-complete="${complete ? 1 : 0}"><code>${escapeHtml(text)}</code></pre>\n`;
    },
    link({ href, title, tokens }) {
      const label = this.parser.parseInline(tokens);
      if (!SAFE_URL.test(href || "")) return `<span>${label}</span>`;
      const titled = title ? ` title="${escapeHtml(title)}"` : "";
      return `<a href="${escapeHtml(href)}"${titled}>${label}</a>`;
    },
    // No <img>: a picture in an answer is a link to it (the page loads nothing a model names).
    image({ href, text }) {
      const label = `${escapeHtml(text || "image")} (image)`;
      return SAFE_URL.test(href || "") ? `<a href="${escapeHtml(href)}">${label}</a>` : `<span>${label}</span>`;
    },
  },
});

/** Render `source` as a DocumentFragment. Highlighting, math and diagrams fill in as soon as their library
 * is there: at once once loaded, else when the first use has loaded it. */
export function renderMarkdown(source) {
  const fragment = sanitize(marked.parse(String(source)));
  for (const table of fragment.querySelectorAll("table")) {
    const wrap = h("div", { class: "table-wrap" });
    table.replaceWith(wrap);
    wrap.append(table);
  }
  for (const pre of fragment.querySelectorAll("pre[data-lang]")) {
    const code = pre.textContent;
    const language = pre.dataset.lang;
    const complete = pre.dataset.complete === "1";
    if (language.toLowerCase() === "mermaid" && complete) {
      const figure = h("figure", { class: "mermaid-diagram" }, codeBlock(code, language));
      pre.replaceWith(figure);
      renderMermaid(figure, code);
    } else {
      const block = codeBlock(code, language);
      pre.replaceWith(block);
      highlightCode(block.querySelector("code"), code, language, block.querySelector(".code-lang"));
    }
  }
  for (const math of fragment.querySelectorAll(".math")) {
    renderMath(math, math.textContent, math.dataset.display === "1");
  }
  return fragment;
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
