// User settings in localStorage. A sampling value left empty means "the server's default" (from /props).
const KEY = "llamba.settings";

export const FIELDS = [
  {
    name: "systemPrompt",
    label: "System prompt",
    kind: "textarea",
    placeholder: "You are a helpful assistant.",
  },
  {
    name: "temperature",
    label: "Temperature",
    kind: "number",
    step: "0.05",
    min: "0",
    max: "2",
    prop: "temperature",
  },
  { name: "top_k", label: "Top-k", kind: "number", step: "1", min: "0", prop: "top_k" },
  { name: "top_p", label: "Top-p", kind: "number", step: "0.01", min: "0", max: "1", prop: "top_p" },
  { name: "min_p", label: "Min-p", kind: "number", step: "0.01", min: "0", max: "1", prop: "min_p" },
  {
    name: "max_tokens",
    label: "Max tokens",
    kind: "number",
    step: "1",
    min: "-1",
    prop: "n_predict",
    hint: "-1: no limit",
  },
  {
    name: "maxToolRounds",
    label: "Max tool rounds",
    kind: "number",
    step: "1",
    min: "1",
    hint: "Tool calls the server runs per answer, when tools are on",
  },
  {
    name: "apiKey",
    label: "API key",
    kind: "password",
    placeholder: "Only if the server was started with --api-key",
  },
  {
    name: "theme",
    label: "Theme",
    kind: "select",
    options: [
      ["system", "System"],
      ["light", "Light"],
      ["dark", "Dark"],
    ],
  },
];

const SAMPLING = FIELDS.filter((f) => f.prop).map((f) => f.name);

export class Settings {
  constructor() {
    this.values = load();
    this.defaults = {}; // the server's, by field name, once /props answered
  }

  get(name) {
    return this.values[name] ?? null;
  }

  /** The value a form shows: the user's, else the server's default, else empty. */
  shown(name) {
    return this.get(name) ?? this.defaults[name] ?? "";
  }

  /** The server's defaults: sampling from /props' generation settings, the tool loop's round limit. */
  setServerDefaults(params, toolLoop = {}) {
    for (const field of FIELDS)
      if (field.prop && params[field.prop] !== undefined) this.defaults[field.name] = params[field.prop];
    if (toolLoop.max_rounds !== undefined) this.defaults.maxToolRounds = toolLoop.max_rounds;
  }

  /** Save a form's values: sampling values equal to the server's default are not kept as overrides. */
  save(values) {
    const next = {};
    for (const field of FIELDS) {
      const raw = values[field.name];
      if (raw === undefined || raw === null || raw === "") continue;
      if (field.kind === "number") {
        const n = Number(raw);
        if (!Number.isFinite(n) || n === this.defaults[field.name]) continue;
        next[field.name] = n;
      } else {
        next[field.name] = raw;
      }
    }
    if (next.theme === "system") delete next.theme;
    this.values = next;
    localStorage.setItem(KEY, JSON.stringify(next));
  }

  /** Sampling fields for a request body: only what the user set; the server fills in the rest. */
  sampling() {
    const out = {};
    for (const name of SAMPLING) if (this.values[name] !== undefined) out[name] = this.values[name];
    return out;
  }

  applyTheme() {
    const chosen = this.get("theme");
    const dark = chosen ? chosen === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
    document.documentElement.dataset.theme = dark ? "dark" : "light";
    document.querySelector('meta[name="theme-color"]')?.setAttribute("content", dark ? "#111318" : "#ffffff");
  }
}

function load() {
  try {
    const data = JSON.parse(localStorage.getItem(KEY) || "{}");
    return data && typeof data === "object" ? data : {};
  } catch {
    return {};
  }
}
