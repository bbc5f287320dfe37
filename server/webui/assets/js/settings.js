// User settings in localStorage, over two layers of defaults: the server's UI config (/props'
// ui_settings, from --ui-config / --ui-config-file) and the server's own sampling (/props'
// default_generation_settings.params). A sampling field left alone sends nothing unless the UI config
// changed it: the server's default then applies. Presets are named sets of the same fields, saved in
// localStorage; a conversation keeps a copy of the one picked for it (stored and exported with it).
const KEY = "llamba.settings";
const PRESETS_KEY = "llamba.presets";
const UINT32_MAX = 4294967295; // /props writes seed -1 (random) as uint32

const num = (name, label, step, extra = {}) => ({ name, label, kind: "number", step, prop: name, ...extra });

export const FIELDS = [
  {
    name: "systemPrompt",
    label: "System prompt",
    kind: "textarea",
    placeholder: "You are a helpful assistant.",
    preset: true,
  },
  num("temperature", "Temperature", "0.05", { min: "0", max: "2" }),
  num("dynatemp_range", "Dynatemp range", "0.05", { min: "0", hint: "Dynamic temperature: ± this much" }),
  num("dynatemp_exponent", "Dynatemp exponent", "0.05", { min: "0" }),
  num("top_k", "Top-k", "1", { min: "0" }),
  num("top_p", "Top-p", "0.01", { min: "0", max: "1" }),
  num("min_p", "Min-p", "0.01", { min: "0", max: "1" }),
  num("typical_p", "Typical-p", "0.01", { min: "0", max: "1" }),
  num("xtc_probability", "XTC probability", "0.01", { min: "0", max: "1" }),
  num("xtc_threshold", "XTC threshold", "0.01", { min: "0", max: "1" }),
  num("repeat_last_n", "Repeat last N", "1", { min: "-1", hint: "-1: the context size" }),
  num("repeat_penalty", "Repeat penalty", "0.01", { min: "0" }),
  num("presence_penalty", "Presence penalty", "0.01"),
  num("frequency_penalty", "Frequency penalty", "0.01"),
  num("dry_multiplier", "DRY multiplier", "0.01", { min: "0", hint: "0: DRY off" }),
  num("dry_base", "DRY base", "0.01", { min: "1" }),
  num("dry_allowed_length", "DRY allowed length", "1", { min: "0" }),
  num("dry_penalty_last_n", "DRY penalty last N", "1", { min: "-1", hint: "-1: the context size" }),
  num("max_tokens", "Max tokens", "1", { min: "-1", prop: "n_predict", hint: "-1: no limit" }),
  num("seed", "Seed", "1", { min: "-1", hint: "-1: random" }),
  {
    name: "samplers",
    label: "Samplers",
    kind: "text",
    prop: "samplers",
    hint: "Their order, separated by ;",
  },
  {
    name: "custom",
    label: "Custom JSON",
    kind: "json",
    placeholder: '{"mirostat": 2}',
    hint: "Fields merged into every request",
    preset: true,
  },
  {
    name: "maxToolRounds",
    label: "Max tool rounds",
    kind: "number",
    step: "1",
    min: "1",
    hint: "Tool calls the server runs per answer, when tools are on",
    preset: true,
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

const BY_NAME = new Map(FIELDS.map((f) => [f.name, f]));
const SAMPLING = FIELDS.filter((f) => f.prop).map((f) => f.name);
/** The fields a preset holds: sampling, the system prompt, custom JSON, the tool rounds. */
export const PRESET_FIELDS = FIELDS.filter((f) => f.prop || f.preset).map((f) => f.name);
// llama.cpp's UI config keys (its settings' names) where they differ from ours
const ALIASES = { systemMessage: "systemPrompt", typ_p: "typical_p", n_predict: "max_tokens" };

/** A custom JSON text as an object; null for empty; throws on invalid JSON or a non-object. */
export function parseCustom(text) {
  if (!text || !String(text).trim()) return null;
  const value = JSON.parse(text);
  if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error("not a JSON object");
  return value;
}

/** A field's value as a form holds it (a string), as stored: a number, a samplers list, text; or
 * undefined for empty or invalid. */
function fromForm(field, raw) {
  if (raw === undefined || raw === null || raw === "") return undefined;
  if (field.kind === "number") {
    const n = Number(raw);
    return Number.isFinite(n) ? n : undefined;
  }
  if (field.name === "samplers") {
    const list = String(raw)
      .split(/[;,]/)
      .map((s) => s.trim())
      .filter(Boolean);
    return list.length ? list : undefined;
  }
  if (field.kind === "json") {
    try {
      return parseCustom(raw) ? String(raw) : undefined;
    } catch {
      return undefined;
    }
  }
  return raw;
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

export class Settings {
  constructor() {
    this.values = load(KEY, {});
    this.presets = load(PRESETS_KEY, []).filter((p) => p && typeof p.name === "string" && p.values);
    this.defaults = {}; // the server's sampling defaults, by field name, once /props answered
    this.ui = {}; // the server's UI config (/props' ui_settings), by field name
  }

  get(name) {
    return this.values[name] ?? this.ui[name] ?? null;
  }

  /** The default under the user's value: the server's UI config's, else the server's own. */
  fallback(name) {
    return this.ui[name] ?? this.defaults[name];
  }

  /** The value a form shows (a string): the user's, else the UI config's, else the server's, else empty. */
  shown(name, values = this.values) {
    const value = values[name] ?? this.fallback(name);
    if (value === undefined || value === null) return "";
    return Array.isArray(value) ? value.join(";") : String(value);
  }

  /** The server's defaults: sampling from /props' generation settings, the tool loop's round limit,
   * and the UI config (`ui_settings`: our field names or llama.cpp's UI's). */
  setServerDefaults(params, toolLoop = {}, uiSettings = {}) {
    for (const field of FIELDS) {
      let value = params[field.prop];
      if (!field.prop || value === undefined) continue;
      if (field.name === "seed" && value === UINT32_MAX) value = -1;
      this.defaults[field.name] = value;
    }
    if (toolLoop.max_rounds !== undefined) this.defaults.maxToolRounds = toolLoop.max_rounds;
    this.ui = {};
    for (const [key, raw] of Object.entries(uiSettings || {})) {
      const field = BY_NAME.get(ALIASES[key] || key);
      if (!field || field.name === "apiKey") continue;
      const text = field.kind === "json" && typeof raw === "object" ? JSON.stringify(raw) : raw;
      const value = fromForm(field, Array.isArray(text) ? text.join(";") : text);
      if (value !== undefined) this.ui[field.name] = value;
    }
  }

  /** A form's values (strings by field name) as stored: empty, invalid and default values left out. */
  normalize(values, names = FIELDS.map((f) => f.name)) {
    const next = {};
    for (const name of names) {
      const field = BY_NAME.get(name);
      const value = fromForm(field, values[name]);
      if (value === undefined || same(value, this.fallback(name))) continue;
      next[name] = value;
    }
    if (next.theme === "system" && this.ui.theme === undefined) delete next.theme;
    return next;
  }

  save(values) {
    this.values = this.normalize(values);
    localStorage.setItem(KEY, JSON.stringify(this.values));
  }

  /** Save the form's preset fields as the preset `name` (one of that name is replaced). */
  savePreset(name, values) {
    const preset = { name, values: this.normalize(values, PRESET_FIELDS) };
    this.presets = [...this.presets.filter((p) => p.name !== name), preset];
    localStorage.setItem(PRESETS_KEY, JSON.stringify(this.presets));
    return preset;
  }

  deletePreset(name) {
    this.presets = this.presets.filter((p) => p.name !== name);
    localStorage.setItem(PRESETS_KEY, JSON.stringify(this.presets));
  }

  /** A field's value for a request under `preset` (a conversation's {name, values}): the preset's, else
   * the user's, else the UI config's. */
  value(name, preset = null) {
    return preset?.values?.[name] ?? this.get(name);
  }

  /** Sampling fields for a request body: the preset's, and what the user or the UI config set apart from
   * the server's defaults; the server fills in the rest. */
  sampling(preset = null) {
    const out = {};
    for (const name of SAMPLING) {
      if (preset?.values?.[name] !== undefined) out[name] = preset.values[name];
      else {
        const value = this.get(name);
        if (value !== null && !same(value, this.defaults[name])) out[name] = value;
      }
    }
    return out;
  }

  /** The custom JSON fields for a request body ({} when none or invalid). */
  custom(preset = null) {
    try {
      return parseCustom(this.value("custom", preset)) || {};
    } catch {
      return {};
    }
  }

  applyTheme() {
    const chosen = this.get("theme");
    const dark =
      chosen && chosen !== "system" ? chosen === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
    document.documentElement.dataset.theme = dark ? "dark" : "light";
    document.querySelector('meta[name="theme-color"]')?.setAttribute("content", dark ? "#111318" : "#ffffff");
  }
}

function load(key, empty) {
  try {
    const data = JSON.parse(localStorage.getItem(key) || "null");
    return data && typeof data === "object" && Array.isArray(data) === Array.isArray(empty) ? data : empty;
  } catch {
    return empty;
  }
}
