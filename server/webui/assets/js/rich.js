// What markdown.js builds beyond text: DOMPurify's sanitising, highlight.js for code, KaTeX for math and
// Mermaid for diagrams. The last three are loaded on first use (first paint stays light) from
// assets/vendor/ (scripts/vendor_webui.py), never from elsewhere; each result is cached by its source, so
// re-rendering a streamed answer does not redo the blocks that did not change.
//
// Everything reaches the page through DOMPurify. The page's CSP allows no inline style, so the style
// attributes KaTeX writes are applied through the CSSOM (which the CSP does not govern), and a diagram's
// <style> becomes a constructed stylesheet scoped to that diagram (@scope): it cannot restyle the rest
// of the page, and no style can load anything from another origin (default-src 'self').
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import { h } from "./dom.js";

const VENDOR = new URL("../vendor/", import.meta.url);
const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;
// DOMPurify's test of URL-like attribute values: its own, less every scheme but http(s) and mailto.
const ALLOWED_URI = /^(?:(?:https?|mailto):|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i;
const MAX_HIGHLIGHT = 100_000; // characters: past this, a block stays plain (highlighting would stall)
const MAX_CACHE = 300;

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName.toLowerCase() === "a") {
    const href = node.getAttribute("href") || node.getAttribute("xlink:href") || "";
    node.removeAttribute("xlink:href");
    if (SAFE_URL.test(href)) {
      node.setAttribute("href", href);
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    } else {
      node.removeAttribute("href");
    }
  }
});

const MARKDOWN = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "img", "form", "input", "button", "textarea", "select"],
  FORBID_ATTR: ["style", "data-css", "src", "srcset"],
  ALLOWED_URI_REGEXP: ALLOWED_URI,
  RETURN_DOM_FRAGMENT: true,
};
// semantics and annotation: KaTeX's TeX source beside its MathML (text only; copy and screen readers).
const MATH = {
  USE_PROFILES: { html: true, mathMl: true, svg: true },
  ADD_TAGS: ["semantics", "annotation"],
  ADD_ATTR: ["encoding"],
  RETURN_DOM_FRAGMENT: true,
};
const DIAGRAM = {
  USE_PROFILES: { svg: true, svgFilters: true },
  FORBID_TAGS: ["style", "foreignObject"],
  ALLOWED_URI_REGEXP: ALLOWED_URI,
  RETURN_DOM_FRAGMENT: true,
};
const SPANS = { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"], RETURN_DOM_FRAGMENT: true };

/** HTML (marked's) as a sanitised DocumentFragment. KaTeX's and Mermaid's `style` attributes travel as
 * `data-css` (even DOMPurify's parse, in an inert document, would count as inline style under the CSP)
 * and are applied through the CSSOM. */
export function sanitize(html, config = MARKDOWN) {
  if (config !== MARKDOWN) html = html.replace(/ style="/g, ' data-css="');
  const fragment = DOMPurify.sanitize(html, config);
  for (const el of fragment.querySelectorAll("[data-css]")) {
    el.style.cssText = el.dataset.css; // the CSSOM, not an inline style attribute the CSP would refuse
    el.removeAttribute("data-css");
  }
  return fragment;
}

function remember(cache, key, value) {
  if (cache.size >= MAX_CACHE) cache.delete(cache.keys().next().value);
  cache.set(key, value);
  return value;
}

function once(load) {
  let promise = null;
  return () => {
    promise ||= load().catch((err) => {
      promise = null; // a failed load may be retried by the next use
      throw err;
    });
    return promise;
  };
}

function loadScript(path) {
  return new Promise((resolve, reject) => {
    const script = h("script", { src: new URL(path, VENDOR).href });
    script.onload = resolve;
    script.onerror = () => reject(new Error(`could not load ${path}`));
    document.head.append(script);
  });
}

function loadStyle(path) {
  return new Promise((resolve, reject) => {
    const link = h("link", { rel: "stylesheet", href: new URL(path, VENDOR).href });
    link.onload = resolve;
    link.onerror = () => reject(new Error(`could not load ${path}`));
    document.head.append(link);
  });
}

// -- code ------------------------------------------------------------------------------------------
let hljs = null;
const highlighted = new Map(); // language \0 code -> {html, language}
const loadHighlighter = once(async () => {
  hljs = (await import(new URL("highlight.js/highlight.min.js", VENDOR).href)).default;
  return hljs;
});

/** Highlight `codeEl` (holding `code` as text) as `language`, or as the language highlight.js detects
 * (then shown in `label`). A language it does not know stays plain. */
export function highlightCode(codeEl, code, language, label) {
  if (code.length > MAX_HIGHLIGHT) return;
  const apply = () => {
    const key = `${language}\0${code}`;
    let done = highlighted.get(key);
    if (!done) {
      const known = language && hljs.getLanguage(language);
      if (language && !known) return;
      const result = known
        ? hljs.highlight(code, { language, ignoreIllegals: true })
        : hljs.highlightAuto(code);
      done = remember(highlighted, key, { html: result.value, language: result.language });
    }
    codeEl.replaceChildren(sanitize(done.html, SPANS));
    codeEl.classList.add("hljs");
    if (!language && done.language) label.textContent = done.language;
  };
  if (hljs) apply();
  else loadHighlighter().then(apply, () => {});
}

// -- math ------------------------------------------------------------------------------------------
let katex = null;
const typeset = new Map(); // display \0 tex -> KaTeX's HTML
const loadKatex = once(async () => {
  await Promise.all([loadScript("katex/katex.min.js"), loadStyle("katex/katex.min.css")]);
  katex = globalThis.katex;
  return katex;
});

/** Typeset `tex` into `el` (inline, or displayed). KaTeX trusts nothing: \href, \url, \includegraphics
 * and HTML extensions render as errors, not links or elements. */
export function renderMath(el, tex, display) {
  const apply = () => {
    const key = `${display ? 1 : 0}\0${tex}`;
    const html =
      typeset.get(key) ??
      remember(
        typeset,
        key,
        katex.renderToString(tex, {
          displayMode: display,
          throwOnError: false,
          trust: false,
          strict: "ignore",
          maxSize: 20,
          maxExpand: 500,
          output: "htmlAndMathml",
        }),
      );
    el.replaceChildren(sanitize(html, MATH));
    el.classList.add("math-done");
  };
  if (katex) apply();
  else loadKatex().then(apply, () => {});
}

// -- diagrams --------------------------------------------------------------------------------------
// Mermaid runs in a sandboxed frame (assets/diagram.html: no origin of its own, no access to this page)
// because it writes inline styles while it lays a diagram out; only the SVG text comes back.
let jobs = 0;
const waiting = new Map(); // job id -> resolve
const drawn = new Map(); // theme \0 source -> {svg, id} or {error}
const drawing = new Map(); // the same key -> its render in progress
const sheets = new Set(); // the diagram ids whose stylesheet is adopted
const openFrame = once(
  () =>
    new Promise((resolve, reject) => {
      const frame = h("iframe", {
        class: "diagram-frame",
        src: new URL("../diagram.html", VENDOR).href,
        sandbox: "allow-scripts",
        title: "Diagram renderer",
        "aria-hidden": "true",
        tabindex: "-1",
      });
      const timer = setTimeout(() => reject(new Error("the diagram renderer did not start")), 30_000);
      window.addEventListener("message", (event) => {
        if (event.source !== frame.contentWindow || !event.data) return;
        if (event.data.ready) {
          clearTimeout(timer);
          resolve(frame);
        } else waiting.get(event.data.id)?.(event.data);
      });
      document.body.append(frame);
    }),
);

async function draw(source, theme) {
  try {
    const frame = await openFrame();
    const id = ++jobs;
    const answer = await new Promise((resolve) => {
      waiting.set(id, resolve);
      frame.contentWindow.postMessage({ id, source, theme }, "*");
    });
    waiting.delete(id);
    if (typeof answer.svg === "string") return { svg: answer.svg, id: `d${id}` };
    return { error: String(answer.error || "the diagram could not be drawn") };
  } catch (err) {
    return { error: String(err?.message || err) };
  }
}

/** Replace `figure`'s code block with the diagram Mermaid draws of `source` (strict security: no
 * clicks, no callbacks, no HTML labels), keeping the source under it; a diagram it cannot parse keeps
 * the code block, with Mermaid's message. */
export function renderMermaid(figure, source) {
  const theme = document.documentElement.dataset.theme === "dark" ? "dark" : "default";
  const key = `${theme}\0${source}`;
  const done = drawn.get(key);
  if (done) {
    showDiagram(figure, done);
    return;
  }
  if (!drawing.has(key)) {
    const job = draw(source, theme);
    drawing.set(key, job);
    job.then((result) => {
      drawing.delete(key);
      remember(drawn, key, result);
    });
  }
  drawing.get(key).then((result) => showDiagram(figure, result));
}

function showDiagram(figure, result) {
  const block = figure.querySelector(".code-block");
  if (!block || figure.dataset.state) return;
  if (result.error) {
    figure.dataset.state = "error";
    figure.prepend(h("p", { class: "diagram-error" }, `Diagram: ${result.error}`));
    return;
  }
  const css = [];
  const svg = result.svg.replace(/<style[^>]*>([\s\S]*?)<\/style>/g, (_, text) => {
    css.push(text);
    return "";
  });
  const fragment = sanitize(svg, DIAGRAM);
  const holder = h("div", { class: "diagram", dataset: { diagram: result.id } }, fragment);
  adoptScoped(result.id, css.join("\n"));
  figure.dataset.state = "drawn";
  figure.replaceChildren(holder, h("details", {}, h("summary", {}, "Diagram source"), block));
}

/** A diagram's own CSS as a constructed stylesheet that applies only inside its holder. */
function adoptScoped(id, css) {
  if (!css || sheets.has(id)) return;
  const sheet = new CSSStyleSheet();
  try {
    sheet.replaceSync(`@scope ([data-diagram="${id}"]) { ${css.replace(/@import[^;]*;?/g, "")} }`);
  } catch {
    return;
  }
  document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
  sheets.add(id);
}
