// Router mode's model picker: the models of GET /models in a <select>; picking one that is not running
// loads it (POST /models/load) and shows its load progress from /models/sse (a bar and the stage).
import { $ } from "../dom.js";

const RUNNING = new Set(["loaded", "sleeping"]);

export class ModelPicker {
  constructor(api, onPick, banner) {
    this.api = api;
    this.onPick = onPick; // (modelId) => void
    this.banner = banner; // (text) => void
    this.statuses = new Map();
    this.current = null;
    this.watching = false;
  }

  /** Show the picker with the router's models, `current` selected, and follow their events. */
  async show(current) {
    const picker = $("#model-picker");
    const { data } = await this.api.models();
    this.statuses = new Map(data.map((m) => [m.id, m.status.value]));
    this.current = current;
    picker.replaceChildren(...data.map((m) => new Option(m.id, m.id, false, m.id === current)));
    picker.hidden = false;
    $("#model-name").hidden = true;
    picker.onchange = () => this.pick(picker.value);
    if (!this.watching) {
      this.watching = true;
      this.#watch();
    }
  }

  pick(id) {
    this.current = id;
    this.onPick(id);
    if (!RUNNING.has(this.statuses.get(id))) {
      this.#progress("start", 0);
      this.api.loadModel(id).catch((err) => this.banner(err.message));
    } else {
      this.#progress(null);
    }
  }

  async #watch() {
    try {
      await this.api.modelEvents((event) => this.#event(event));
    } catch {
      // the stream ended (server restart): the next show() watches again
    }
    this.watching = false;
  }

  #event(event) {
    if (event.event !== "model_status") return;
    const { status, progress } = event.data;
    this.statuses.set(event.model, status);
    if (event.model !== this.current) return;
    if (status === "loading") this.#progress(progress?.stage || "start", progress?.value || 0);
    else this.#progress(null);
    if (status === "failed") this.banner(`${event.model} failed to load: ${(event.data.log || []).slice(-1)[0] || ""}`);
  }

  #progress(stage, value = 0) {
    const bar = $("#model-progress");
    const label = $("#model-stage");
    bar.hidden = label.hidden = stage === null;
    if (stage === null) return;
    bar.value = value;
    label.textContent = `Loading ${this.current}: ${stage}`;
  }
}
