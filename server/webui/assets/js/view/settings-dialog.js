// The Settings dialog: fields from settings.FIELDS, server defaults shown where the user set nothing
// (the UI config's, else the server's); "Add preset" keeps the form's preset fields under a name, and
// each saved preset has its Delete button (a conversation that picked it keeps its own copy).
import { h } from "../dom.js";
import { FIELDS, parseCustom } from "../settings.js";
import { toast } from "./toast.js";

export class SettingsDialog {
  constructor({ dialog, form, fields, notice, settings, onSaved, onPreset }) {
    Object.assign(this, { dialog, form, notice, settings, onSaved, onPreset });
    this.inputs = new Map(FIELDS.map((f) => [f.name, input(f)]));
    fields.replaceChildren(...FIELDS.map((f) => row(f, this.inputs.get(f.name))));
    const custom = this.inputs.get("custom");
    custom.addEventListener("input", () => custom.setCustomValidity(customError(custom.value)));
    this.presetName = dialog.querySelector("#preset-name");
    this.presetList = dialog.querySelector("#preset-list");
    dialog.querySelector("#save-preset").addEventListener("click", () => this.#savePreset());
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.#save();
    });
    dialog.querySelector("#cancel-settings").addEventListener("click", () => dialog.close());
    dialog.querySelector("#close-settings").addEventListener("click", () => dialog.close());
    dialog.querySelector("#reset-settings").addEventListener("click", () => this.#reset());
    dialog.addEventListener("click", (event) => event.target === dialog && dialog.close()); // the backdrop
  }

  open(notice = "") {
    for (const [name, el] of this.inputs) {
      const value = this.settings.shown(name); // 0 is a value: no `||` here
      el.value = String(value === "" && name === "theme" ? "system" : value);
      el.setCustomValidity?.("");
    }
    this.notice.hidden = !notice;
    this.notice.textContent = notice;
    this.#renderPresets();
    this.dialog.showModal();
    (notice ? this.inputs.get("apiKey") : this.inputs.get("systemPrompt")).focus();
  }

  #reset() {
    for (const field of FIELDS) {
      if (field.prop) this.inputs.get(field.name).value = this.settings.shown(field.name, {});
    }
  }

  #values() {
    return Object.fromEntries([...this.inputs].map(([name, el]) => [name, el.value]));
  }

  #savePreset() {
    const name = this.presetName.value.trim();
    if (!name) {
      this.presetName.setCustomValidity("Name the preset");
      this.presetName.reportValidity();
      this.presetName.setCustomValidity("");
      return;
    }
    if (!this.form.reportValidity()) return;
    const preset = this.settings.savePreset(name, this.#values());
    this.presetName.value = "";
    toast(`Preset “${name}” saved`);
    this.#renderPresets();
    this.onPreset(preset);
  }

  /** The saved presets, each with its Delete button. */
  #renderPresets() {
    const names = this.settings.presets.map((p) => p.name);
    this.presetList.hidden = !names.length;
    this.presetList.replaceChildren(
      ...names.map((name) =>
        h(
          "li",
          { class: "preset-item" },
          h("span", { class: "preset-name" }, name),
          h(
            "button",
            {
              type: "button",
              class: "button ghost small",
              "aria-label": `Delete preset “${name}”`,
              onclick: () => this.#deletePreset(name),
            },
            "Delete",
          ),
        ),
      ),
    );
  }

  #deletePreset(name) {
    this.settings.deletePreset(name);
    toast(`Preset “${name}” deleted`);
    this.#renderPresets();
    this.presetName.focus(); // the button is gone: focus stays in the dialog
    this.onPreset(null);
  }

  #save() {
    this.settings.save(this.#values());
    this.dialog.close();
    this.onSaved();
  }
}

/** Why a custom JSON text is refused ("" when it is empty or a JSON object). */
function customError(text) {
  try {
    parseCustom(text);
    return "";
  } catch (err) {
    return `Custom JSON: ${err.message}`;
  }
}

function input(field) {
  const id = `setting-${field.name}`;
  if (field.kind === "textarea" || field.kind === "json") {
    const rows = field.kind === "json" ? 2 : 3;
    const attrs = { id, name: field.name, rows, placeholder: field.placeholder, spellcheck: "false" };
    if (field.kind === "textarea") delete attrs.spellcheck;
    return h("textarea", attrs);
  }
  if (field.kind === "select") {
    return h(
      "select",
      { id, name: field.name },
      field.options.map(([value, label]) => h("option", { value }, label)),
    );
  }
  const attrs = { id, name: field.name, placeholder: field.placeholder, autocomplete: "off" };
  if (field.kind === "number")
    Object.assign(attrs, {
      type: "number",
      inputmode: "decimal",
      step: field.step,
      min: field.min,
      max: field.max,
    });
  else attrs.type = field.kind;
  return h("input", attrs);
}

function row(field, el) {
  const wide = ["textarea", "json", "password"].includes(field.kind);
  const hint = field.hint ? h("span", { class: "field-hint" }, field.hint) : null;
  return h(
    "div",
    { class: `field${wide ? " wide" : ""}` },
    h("label", { for: el.id }, field.label),
    el,
    hint,
  );
}
