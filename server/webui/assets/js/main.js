// Start-up and wiring: settings (with the server's UI config and the presets), the server's /props and
// tools, conversations (message trees: tree.js), the composer (with its attachments, Tools switches,
// preset picker and context gauge), the sidebar, dialogs (settings, a tool's permission prompt).
import { Api, ApiError } from "./api.js";
import { Chat, LIVE_STATUSES } from "./chat.js";
import { $, h, newId, sleep } from "./dom.js";
import { decorate } from "./icons.js";
import { Settings } from "./settings.js";
import { openStore } from "./store.js";
import { pathOf } from "./tree.js";
import { download, exportJson, parseImport } from "./transfer.js";
import { Attachments } from "./view/attachments.js";
import { SettingsDialog } from "./view/settings-dialog.js";
import { ModelPicker } from "./view/model-picker.js";
import { Sidebar } from "./view/sidebar.js";
import { Thread } from "./view/thread.js";
import { toast } from "./view/toast.js";

const PHONE = matchMedia("(max-width: 760px)");

class App {
  constructor(store) {
    this.store = store;
    this.settings = new Settings();
    this.api = new Api(this.settings);
    this.model = null;
    // Whether /props' model reads images and audio (null: /props did not say). Router mode: /props
    // describes the default model only, so a picked other model is "not known" and the server has the
    // last word.
    this.propsVision = { model: null, vision: null, audio: null };
    // Router mode: the picked model is the one the next chats name (`model`).
    this.picker = new ModelPicker(
      this.api,
      (id) => {
        this.model = id;
        const known = id === this.propsVision.model;
        this.attachments.setModalities(known ? this.propsVision : { vision: null, audio: null });
        if (!this.current?.messages.length) this.thread.show(this.current, this.model);
      },
      (text) => this.#banner(text),
    );
    this.current = null; // the open conversation, or null for a new chat not sent yet
    // [{label, tools: [{name, write}]}] from GET /tools; `write`: a built-in tool that writes or runs
    // commands, which asks the user before it runs (MCP tools run once their server is switched on)
    this.mcpServers = [];
    this.toolsLoaded = false;
    // Whether the server has /tools (/props' endpoint_tools; an older server that does not say: asked
    // anyway); null until /props answered.
    this.serverTools = null;
    // the switches and preset of a new chat, until its first message creates it
    this.pendingServers = [];
    this.pendingToolsOff = [];
    this.pendingPreset = null;
    this.asking = false; // a permission prompt is up (one at a time)
    this.chat = new Chat({
      store,
      api: this.api,
      settings: this.settings,
      onUpdate: (c, m) => this.#onUpdate(c, m),
      toolsFor: (c) => this.#requestTools(c),
    });
    this.thread = new Thread({
      scroller: $("#messages"),
      root: $("#thread"),
      chat: this.chat,
      onSkip: (id) =>
        this.chat.skipThinking(id).catch((err) => toast(`Skip thinking failed: ${err.message}`, "error")),
      onSuggestion: (text) => this.#fill(text),
      onEdit: (id, text) => this.edit(id, text),
      onRegenerate: (id) => this.regenerate(id),
      onContinue: (id) => this.continueAnswer(id),
      onSwitch: (id) => this.#branch((c) => this.chat.switchTo(c, id)),
      onDelete: (id) => this.#branch((c) => this.chat.deleteBranch(c, id)),
    });
    this.nCtx = null; // the context of one slot (/props' default_generation_settings.n_ctx)
    this.sidebar = new Sidebar({
      list: $("#conversation-list"),
      empty: $("#empty-list"),
      search: $("#search"),
      store,
      chat: this.chat,
      onSelect: (id) => this.open(id),
      onRename: (id, title) => this.rename(id, title),
      onDelete: (id) => this.remove(id),
    });
    this.settingsDialog = new SettingsDialog({
      dialog: $("#settings-dialog"),
      form: $("#settings-form"),
      fields: $("#settings-fields"),
      notice: $("#settings-notice"),
      settings: this.settings,
      onSaved: () => this.#settingsSaved(),
      onPreset: () => this.#renderPresets(),
    });
    this.input = $("#message");
    this.attachments = new Attachments({
      button: $("#attach"),
      input: $("#attach-file"),
      list: $("#attachments"),
      notice: $("#attach-notice"),
      dropZone: $(".main"),
      composer: $("#composer"),
      textarea: this.input,
      onChange: () => this.#syncComposer(),
    });
    // A conversation the browser would not store (its images filled the quota, storage is off) stays open
    // in memory: say so once, rather than lose it silently at the next reload.
    store.onError = (conversation, err) => {
      const why = err?.name === "QuotaExceededError" ? "the browser's storage is full" : err?.message || err;
      toast(
        `“${conversation.title}” could not be saved in this browser (${why}). It stays open until this tab ` +
          "closes: Export it to keep a copy.",
        "error",
        12000,
      );
    };
  }

  start() {
    decorate();
    this.settings.applyTheme();
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => this.settings.applyTheme());
    this.#wireComposer();
    this.#wireChrome();
    this.open(idFromHash(), { replace: true });
    this.chat.resumeAll();
    document.addEventListener(
      "visibilitychange",
      () => document.visibilityState === "visible" && this.chat.resumeAll(),
    );
    this.loadProps().then(() => this.loadTools());
  }

  // -- the server ------------------------------------------------------------------------------------
  async loadProps() {
    for (;;) {
      try {
        const props = await this.api.props();
        this.model = props.model_alias || "default";
        const vision = props.modalities ? Boolean(props.modalities.vision) : null;
        const audio = props.modalities ? Boolean(props.modalities.audio) : null;
        this.propsVision = { model: this.model, vision, audio };
        this.attachments.setModalities(this.propsVision);
        const params = props.default_generation_settings?.params || {};
        this.settings.setServerDefaults(params, props.tool_loop, props.ui_settings);
        this.settings.applyTheme();
        this.nCtx = props.default_generation_settings?.n_ctx || null;
        this.#renderGauge();
        this.serverTools = props.endpoint_tools !== false;
        $("#model-name").textContent = this.model;
        if (props.role === "router") await this.picker.show(this.model);
        this.#banner("");
        if (!this.current?.messages.length) this.thread.show(this.current, this.model);
        return;
      } catch (err) {
        if (err instanceof ApiError && err.status === 401) {
          this.#banner("This server needs an API key: open Settings to enter it.");
          if (!$("#settings-dialog").open) this.settingsDialog.open("This server needs an API key.");
          return;
        }
        this.#banner(
          err instanceof ApiError && err.status === 503
            ? "Loading the model…"
            : "Cannot reach the server; retrying…",
        );
        await sleep(2000);
      }
    }
  }

  /** The MCP servers the chat can switch on (their tools, grouped by server); none hides the Tools. */
  async loadTools() {
    if (this.serverTools === null) return; // no /props yet (an API key is asked for): once it answers
    if (!this.serverTools) {
      this.mcpServers = [];
      this.toolsLoaded = true;
      this.#renderTools();
      return;
    }
    try {
      const tools = await this.api.tools();
      const servers = new Map();
      for (const tool of tools) {
        const builtin = tool.type === "server"; // llama-server's built-in tools carry no server: "builtin"
        const label = tool.server || (builtin ? "builtin" : "");
        if (!servers.has(label)) servers.set(label, []);
        servers.get(label).push({ name: tool.tool, write: builtin && Boolean(tool.permissions?.write) });
      }
      this.mcpServers = [...servers].map(([label, list]) => ({ label, tools: list }));
      this.toolsLoaded = true;
    } catch (err) {
      const locked = err instanceof ApiError && err.status === 401; // the key prompt is already up
      if (!locked) toast(`Could not list the MCP tools: ${err.message}`, "error");
    }
    this.#renderTools();
  }

  /** A conversation's switches, less servers this server no longer has (they would make it a 400,
   * and no switch is shown to turn them off). */
  #pruneServers(conversation) {
    if (!this.toolsLoaded || !conversation.mcpServers?.length) return;
    const known = new Set(this.mcpServers.map((s) => s.label));
    conversation.mcpServers = conversation.mcpServers.filter((label) => known.has(label));
  }

  #renderTools() {
    $("#composer-tools").hidden = !this.mcpServers.length;
    const on = new Set(this.current ? this.current.mcpServers || [] : this.pendingServers);
    const off = new Set(this.current ? this.current.toolsOff || [] : this.pendingToolsOff);
    $("#tools-list").replaceChildren(
      ...this.mcpServers.map(({ label, tools }) => {
        const names = tools.map((t) => t.name).join(", ");
        const hint = h("span", { class: "server-tools", id: `tools-of-${label}` }, names);
        const box = h("input", {
          type: "checkbox",
          "aria-label": label,
          "aria-describedby": hint.id,
          checked: on.has(label),
          onchange: () => this.#toggleServer(label, box.checked),
        });
        const server = h(
          "label",
          { class: "server-switch" },
          box,
          h("span", { class: "server-name" }, label),
          hint,
        );
        // each tool's own switch, for this conversation (while its server is on)
        const switches = tools.map((tool) => {
          const toolBox = h("input", {
            type: "checkbox",
            "aria-label": tool.name,
            checked: !off.has(tool.name),
            disabled: !on.has(label),
            onchange: () => this.#toggleTool(tool.name, toolBox.checked),
          });
          const badge = tool.write
            ? h("span", { class: "tool-writes", title: "Asks before it runs" }, "writes")
            : null;
          return h("label", { class: "tool-switch" }, toolBox, tool.name, badge);
        });
        return h("div", { class: "server-group" }, server, h("div", { class: "tool-switches" }, switches));
      }),
    );
    const count = [...on].filter((label) => this.mcpServers.some((s) => s.label === label)).length;
    $("#tools-count").textContent = count ? String(count) : "";
  }

  async #toggleServer(label, enabled) {
    const list = this.current ? this.current.mcpServers || [] : this.pendingServers;
    const next = enabled ? [...new Set([...list, label])] : list.filter((l) => l !== label);
    if (!this.current) this.pendingServers = next;
    else {
      this.current.mcpServers = next;
      await this.store.put(this.current);
    }
    this.#renderTools();
  }

  async #toggleTool(name, enabled) {
    const list = this.current ? this.current.toolsOff || [] : this.pendingToolsOff;
    const next = enabled ? list.filter((n) => n !== name) : [...new Set([...list, name])];
    if (!this.current) this.pendingToolsOff = next;
    else {
      this.current.toolsOff = next;
      await this.store.put(this.current);
    }
  }

  /** The request's `mcp` tools for a conversation: its servers on, each narrowed to the tools left on
   * (allowed_tools), and, where a tool that writes or runs commands is on, `approved_tools`: those the
   * user allowed, with every other tool on (the server runs no unapproved writing tool). */
  #requestTools(conversation) {
    const off = new Set(conversation.toolsOff || []);
    const approved = new Set(conversation.approvedTools || []);
    const tools = [];
    const enabled = [];
    for (const label of conversation.mcpServers || []) {
      const server = this.mcpServers.find((s) => s.label === label);
      const names = server ? server.tools.filter((t) => !off.has(t.name)) : null;
      if (names && !names.length) continue; // every tool of it off: the server is left out
      const entry = { type: "mcp", server_label: label };
      if (names && names.length < server.tools.length) entry.allowed_tools = names.map((t) => t.name);
      tools.push(entry);
      enabled.push(...(names || []));
    }
    if (!enabled.some((t) => t.write)) return { tools };
    const allowed = enabled.filter((t) => !t.write || approved.has(t.name)).map((t) => t.name);
    return { tools, approved_tools: allowed };
  }

  /** An answer the server paused before a tool that writes or runs commands (`pendingApproval`) asks the
   * user, tool by tool: “Allow NAME?” with the call's arguments. Allowed tools are approved for the
   * conversation; then the answer goes on (Chat.resumeTools: the server runs the allowed calls, a denied
   * one's result says so). Dismissed (Escape), it asks again when the conversation is opened. */
  async #checkPermission(conversation, message) {
    if (message?.role !== "assistant" || !message.pendingApproval?.length || this.asking) return;
    if (conversation !== this.current || this.chat.isBusy(conversation.id)) return;
    const approved = new Set(conversation.approvedTools || []);
    const denied = [];
    this.asking = true;
    try {
      for (const name of message.pendingApproval) {
        const call = (message.tools || []).find((c) => c.waiting && c.name === name);
        const choice = await askPermission(name, call?.arguments);
        if (choice === "allow") approved.add(name);
        else if (choice === "deny") denied.push(name);
        else return;
      }
    } finally {
      this.asking = false;
    }
    conversation.approvedTools = [...approved];
    await this.store.put(conversation);
    if (this.current !== conversation) return;
    const answering = this.chat.resumeTools(conversation, message.id, this.model || "default", denied);
    this.thread.show(conversation, this.model);
    this.#syncComposer();
    await answering;
  }

  // -- presets ---------------------------------------------------------------------------------------
  /** The composer's preset picker: the saved presets, and the open conversation's own (an imported one
   * may have a preset this browser has not saved). */
  #renderPresets() {
    const picker = $("#preset-picker");
    const chosen = this.current ? this.current.preset || null : this.pendingPreset;
    const names = this.settings.presets.map((p) => p.name);
    if (chosen && !names.includes(chosen.name)) names.push(chosen.name);
    $("#preset-pick").hidden = !names.length;
    picker.replaceChildren(
      h("option", { value: "" }, "Default settings"),
      ...names.map((name) => h("option", { value: name }, name)),
    );
    picker.value = chosen?.name || "";
  }

  async #pickPreset(name) {
    const saved = this.settings.presets.find((p) => p.name === name);
    const own = this.current?.preset?.name === name ? this.current.preset : null;
    const found = saved || own;
    const preset = found ? { name, values: structuredClone(found.values) } : null;
    if (!this.current) this.pendingPreset = preset;
    else {
      if (preset) this.current.preset = preset;
      else delete this.current.preset;
      await this.store.put(this.current);
    }
    toast(preset ? `Preset “${name}” for this conversation` : "Default settings for this conversation");
  }

  #banner(text) {
    const banner = $("#banner");
    banner.hidden = !text;
    banner.textContent = text;
  }

  // -- conversations ---------------------------------------------------------------------------------
  open(id, { replace = false } = {}) {
    const conversation = id ? this.store.get(id) : null;
    this.current = conversation;
    const hash = conversation ? `#/c/${encodeURIComponent(conversation.id)}` : "#/";
    if (location.hash !== hash) history[replace ? "replaceState" : "pushState"](null, "", hash);
    $("#chat-title").textContent = conversation?.title || "New chat";
    document.title = conversation ? `${conversation.title} · Llamba` : "Llamba";
    this.thread.show(conversation, this.model);
    this.sidebar.render(conversation?.id || null);
    this.#renderTools();
    this.#renderPresets();
    this.#syncComposer();
    this.#renderGauge();
    this.#closeSidebar();
    if (conversation) this.#checkPermission(conversation, pathOf(conversation).at(-1));
  }

  newChat() {
    this.open(null);
    this.input.focus();
  }

  async rename(id, title) {
    const conversation = this.store.get(id);
    if (!conversation) return;
    conversation.title = title;
    await this.store.put(conversation);
    if (this.current === conversation) {
      $("#chat-title").textContent = title;
      document.title = `${title} · Llamba`;
    }
  }

  async remove(id) {
    const conversation = this.store.get(id);
    if (!conversation || !confirm(`Delete “${conversation.title}”? This cannot be undone.`)) return;
    await this.chat.stop(id);
    await this.store.delete(id);
    if (this.current === conversation) this.open(null);
    else this.sidebar.render();
    toast("Conversation deleted");
  }

  async send() {
    const text = this.input.value.trim();
    const hasImages = this.attachments.items.length > 0;
    if ((!text && !hasImages) || (this.current && this.chat.isBusy(this.current.id))) return;
    const attached = this.attachments.take();
    const images = attached.filter((item) => item.kind !== "text" && item.kind !== "pdf");
    const files = attached.filter((item) => item.kind === "text" || item.kind === "pdf");
    let conversation = this.current;
    if (!conversation) {
      const now = Date.now();
      const title = titleFrom(text || attached[0].name);
      conversation = { id: newId(), title, createdAt: now, updatedAt: now, messages: [] };
      conversation.mcpServers = this.pendingServers;
      conversation.toolsOff = this.pendingToolsOff;
      if (this.pendingPreset) conversation.preset = this.pendingPreset;
      this.pendingServers = [];
      this.pendingToolsOff = [];
      this.pendingPreset = null;
      this.store.items.set(conversation.id, conversation);
      this.open(conversation.id);
    }
    this.input.value = "";
    this.#autosize();
    this.#pruneServers(conversation);
    const sending = this.chat.send(conversation, text, this.model || "default", images, files);
    this.thread.show(conversation, this.model);
    this.sidebar.render();
    this.#syncComposer();
    await sending;
  }

  /** Resend an edited user message of the open conversation (the answers after it are replaced). */
  async edit(messageId, text) {
    const conversation = this.current;
    if (!conversation) return;
    if (this.chat.isBusy(conversation.id)) {
      toast("Stop the answer being written first", "error");
      this.thread.show(conversation, this.model);
      return;
    }
    this.#pruneServers(conversation);
    const editing = this.chat.edit(conversation, messageId, text, this.model || "default");
    this.thread.show(conversation, this.model);
    this.#syncComposer();
    await editing;
  }

  /** A new answer beside answer `id` (default: the shown branch's last) of the open conversation. */
  async regenerate(id = null) {
    const conversation = this.current;
    if (!conversation || this.chat.isBusy(conversation.id)) return;
    this.#pruneServers(conversation);
    const answering = this.chat.regenerate(conversation, this.model || "default", id);
    this.thread.show(conversation, this.model);
    this.#syncComposer();
    await answering;
  }

  /** Continue the cut answer `id` (the shown branch's last message). */
  async continueAnswer(id) {
    const conversation = this.current;
    if (!conversation || this.chat.isBusy(conversation.id)) return;
    this.#pruneServers(conversation);
    const answering = this.chat.continue(conversation, id, this.model || "default");
    this.thread.show(conversation, this.model);
    this.#syncComposer();
    await answering;
  }

  /** Switch versions or delete a branch of the open conversation, then draw the branch shown. */
  async #branch(action) {
    const conversation = this.current;
    if (!conversation || this.chat.isBusy(conversation.id)) return;
    await action(conversation);
    this.thread.show(conversation, this.model);
    this.sidebar.render(conversation.id);
    this.#renderGauge();
  }

  /** The context gauge: the tokens the shown branch's last answer left in its slot (its prompt, cached
   * or not, and what it wrote: timings' cache_n + prompt_n + predicted_n) of the slot's n_ctx. */
  #renderGauge() {
    const gauge = $("#context-gauge");
    const last = pathOf(this.current).findLast((m) => m.role === "assistant" && m.timings);
    const t = last?.timings;
    if (!t || !this.nCtx) {
      gauge.hidden = true;
      return;
    }
    const used = (t.cache_n || 0) + (t.prompt_n || 0) + (t.predicted_n || 0);
    const share = Math.min(used / this.nCtx, 1);
    gauge.hidden = false;
    const meter = $("#context-meter");
    meter.max = this.nCtx;
    meter.value = Math.min(used, this.nCtx);
    $("#context-text").textContent =
      `Context: ${used.toLocaleString("en")} / ${this.nCtx.toLocaleString("en")} tokens (${Math.round(share * 100)}%)`;
    gauge.classList.toggle("context-full", share >= 0.9);
  }

  #onUpdate(conversation, message) {
    this.thread.update(conversation, message);
    if (!LIVE_STATUSES.has(message.status)) {
      this.sidebar.render();
      if (conversation === this.current) this.#announce(message);
      if (conversation === this.current) this.#renderGauge();
      if (conversation === this.current && message.status === "done")
        this.#checkPermission(conversation, message);
    }
    if (conversation === this.current) this.#syncComposer();
  }

  #announce(message) {
    const text = {
      done: "Answer complete.",
      stopped: "Answer stopped.",
      lost: "The answer was lost.",
      error: "The answer failed.",
    };
    if (text[message.status]) $("#announcer").textContent = text[message.status];
  }

  // -- composer --------------------------------------------------------------------------------------
  #wireComposer() {
    $("#composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      } else if (event.key === "Escape" && this.current && this.chat.isBusy(this.current.id)) {
        this.chat.stop(this.current.id);
      }
    });
    this.input.addEventListener("input", () => {
      this.#autosize();
      this.#syncComposer();
    });
    $("#stop").addEventListener("click", () => this.current && this.chat.stop(this.current.id));
    $("#preset-picker").addEventListener("change", (event) => this.#pickPreset(event.target.value));
    $("#tools-toggle").addEventListener("click", () => {
      const panel = $("#tools-panel");
      panel.hidden = !panel.hidden;
      $("#tools-toggle").setAttribute("aria-expanded", String(!panel.hidden));
    });
  }

  #syncComposer() {
    const busy = Boolean(this.current && this.chat.isBusy(this.current.id));
    const send = $("#send");
    const stop = $("#stop");
    const hadFocus = document.activeElement === (busy ? send : stop);
    send.hidden = busy;
    stop.hidden = !busy;
    send.disabled = !this.input.value.trim() && !this.attachments.items.length;
    if (hadFocus) (busy ? stop : this.input).focus();
  }

  #autosize() {
    this.input.style.height = "auto";
    this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`;
  }

  #fill(text) {
    this.input.value = text;
    this.#autosize();
    this.#syncComposer();
    this.input.focus();
  }

  // -- sidebar, settings, import/export, keys ---------------------------------------------------------
  #wireChrome() {
    $("#new-chat").addEventListener("click", () => this.newChat());
    $("#open-settings").addEventListener("click", () => this.settingsDialog.open());
    $("#export").addEventListener("click", () => this.#export());
    $("#import").addEventListener("click", () => $("#import-file").click());
    $("#import-file").addEventListener("change", (event) => this.#import(event.target));
    $("#open-sidebar").addEventListener("click", () => this.#openSidebar());
    $("#close-sidebar").addEventListener("click", () => this.#closeSidebar());
    $("#backdrop").addEventListener("click", () => this.#closeSidebar());
    window.addEventListener(
      "hashchange",
      () => location.hash.startsWith("#/") && this.open(idFromHash(), { replace: true }),
    );
    $(".skip-link").addEventListener("click", (event) => {
      event.preventDefault();
      this.input.focus();
    });
    document.addEventListener("keydown", (event) => this.#shortcut(event));
  }

  #shortcut(event) {
    const mod = event.ctrlKey || event.metaKey;
    if (mod && event.shiftKey && event.key.toLowerCase() === "o") {
      event.preventDefault();
      this.newChat();
    } else if (mod && event.key.toLowerCase() === "k") {
      event.preventDefault();
      this.#openSidebar();
      $("#search").focus();
    } else if (event.key === "Escape" && document.body.classList.contains("sidebar-open")) {
      this.#closeSidebar();
      $("#open-sidebar").focus();
    }
  }

  #openSidebar() {
    if (!PHONE.matches) return;
    document.body.classList.add("sidebar-open");
    $("#backdrop").hidden = false;
    $("#open-sidebar").setAttribute("aria-expanded", "true");
    $("#new-chat").focus();
  }

  #closeSidebar() {
    document.body.classList.remove("sidebar-open");
    $("#backdrop").hidden = true;
    $("#open-sidebar").setAttribute("aria-expanded", "false");
  }

  #settingsSaved() {
    this.settings.applyTheme();
    toast("Settings saved");
    if (!this.model) this.loadProps().then(() => this.loadTools());
  }

  #export() {
    const conversations = this.store.list();
    const day = new Date().toISOString().slice(0, 10);
    download(exportJson(conversations), `llamba-conversations-${day}.json`);
    toast(`Exported ${conversations.length} conversation${conversations.length === 1 ? "" : "s"}`);
  }

  async #import(fileInput) {
    const file = fileInput.files?.[0];
    fileInput.value = "";
    if (!file) return;
    try {
      const conversations = parseImport(await file.text());
      for (const conversation of conversations) {
        if (this.chat.isBusy(conversation.id)) continue; // never overwrite an answer being written
        await this.store.put(conversation);
      }
      this.sidebar.render();
      if (this.current) this.open(this.current.id, { replace: true });
      toast(`Imported ${conversations.length} conversation${conversations.length === 1 ? "" : "s"}`);
    } catch (err) {
      toast(`Import failed: ${err.message}`, "error", 6000);
    }
  }
}

/** The permission prompt for one tool: "allow", "deny", or "" (dismissed). */
async function askPermission(name, args) {
  const dialog = $("#permission-dialog");
  $("#permission-title").textContent = `Allow ${name}?`;
  $("#permission-text").textContent =
    `The model wants to use ${name}, which writes files or runs commands on the server. ` +
    "It has not run: allow it for this conversation, or deny this call?";
  $("#permission-args").textContent = pretty(args || "{}");
  dialog.returnValue = "";
  dialog.showModal();
  $("#permission-deny").focus();
  await new Promise((resolve) => dialog.addEventListener("close", resolve, { once: true }));
  return dialog.returnValue;
}

/** A call's JSON arguments indented for reading (as the model wrote them when they are not JSON). */
function pretty(json) {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return json;
  }
}

function idFromHash() {
  const m = /^#\/c\/(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

function titleFrom(text) {
  const line = text.split("\n")[0].trim();
  if (line.length <= 48) return line;
  const cut = line.slice(0, 48);
  return `${cut.slice(0, cut.lastIndexOf(" ") > 24 ? cut.lastIndexOf(" ") : 48)}…`;
}

async function main() {
  let store;
  try {
    store = await openStore(() => {
      document.getElementById("banner").hidden = false;
      document.getElementById("banner").textContent =
        "Another Llamba tab (an older version) holds the conversations: close it to go on.";
    });
  } catch (err) {
    document.getElementById("banner").hidden = false;
    document.getElementById("banner").textContent =
      `Conversations cannot be stored in this browser: ${err.message}`;
    return;
  }
  const app = new App(store);
  window.llamba = app; // for the console (and tests): the app's state, read-only by convention
  app.start();
}

main();
