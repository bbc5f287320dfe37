// The Settings dialog: fields from settings.FIELDS, server defaults shown where the user set nothing.
import { h } from "../dom.js";
import { FIELDS } from "../settings.js";

export class SettingsDialog {
  constructor({ dialog, form, fields, notice, settings, onSaved }) {
    Object.assign(this, { dialog, form, notice, settings, onSaved });
    this.inputs = new Map(FIELDS.map((f) => [f.name, input(f)]));
    fields.replaceChildren(...FIELDS.map((f) => row(f, this.inputs.get(f.name))));
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
    }
    this.notice.hidden = !notice;
    this.notice.textContent = notice;
    this.dialog.showModal();
    (notice ? this.inputs.get("apiKey") : this.inputs.get("systemPrompt")).focus();
  }

  #reset() {
    for (const field of FIELDS) {
      if (field.prop) this.inputs.get(field.name).value = String(this.settings.defaults[field.name] ?? "");
    }
  }

  #save() {
    const values = Object.fromEntries([...this.inputs].map(([name, el]) => [name, el.value]));
    this.settings.save(values);
    this.dialog.close();
    this.onSaved();
  }
}

function input(field) {
  const id = `setting-${field.name}`;
  if (field.kind === "textarea")
    return h("textarea", { id, name: field.name, rows: 3, placeholder: field.placeholder });
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
  const wide = field.kind === "textarea" || field.kind === "password";
  const hint = field.hint ? h("span", { class: "field-hint" }, field.hint) : null;
  return h(
    "div",
    { class: `field${wide ? " wide" : ""}` },
    h("label", { for: el.id }, field.label),
    el,
    hint,
  );
}
