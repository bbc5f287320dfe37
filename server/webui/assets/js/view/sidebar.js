// The conversation list: search, select, rename in place, delete; arrow keys move between entries.
import { h } from "../dom.js";
import { icon } from "../icons.js";

export class Sidebar {
  constructor({ list, empty, search, store, chat, onSelect, onRename, onDelete }) {
    Object.assign(this, { list, empty, search, store, chat, onSelect, onRename, onDelete });
    this.currentId = null;
    this.renaming = null;
    let timer = 0;
    search.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => this.render(), 120);
    });
    list.addEventListener("keydown", (event) => this.#onKey(event));
  }

  render(currentId = this.currentId) {
    this.currentId = currentId;
    const query = this.search.value;
    const items = this.store.list(query);
    this.list.replaceChildren(...items.map((c) => this.#item(c)));
    this.empty.hidden = items.length > 0;
    this.empty.textContent = query.trim() ? "No conversation matches." : "No conversations yet.";
  }

  #item(conversation) {
    const current = conversation.id === this.currentId;
    const busy = this.chat.isBusy(conversation.id);
    if (this.renaming === conversation.id)
      return h("li", { class: "conv renaming" }, this.#renameInput(conversation));
    const open = h(
      "button",
      {
        type: "button",
        class: "conv-open",
        "aria-current": current ? "page" : null,
        onclick: () => this.onSelect(conversation.id),
      },
      h("span", { class: "conv-title" }, conversation.title),
      h(
        "span",
        { class: "conv-sub", "aria-hidden": "true" },
        busy ? h("span", { class: "live-dot", title: "Answering" }) : null,
        relativeTime(conversation.updatedAt),
      ),
    );
    const rename = h(
      "button",
      {
        type: "button",
        class: "icon-button small",
        "aria-label": `Rename “${conversation.title}”`,
        onclick: () => this.#startRename(conversation.id),
      },
      icon("pencil", 15),
    );
    const remove = h(
      "button",
      {
        type: "button",
        class: "icon-button small danger",
        "aria-label": `Delete “${conversation.title}”`,
        onclick: () => this.onDelete(conversation.id),
      },
      icon("trash", 15),
    );
    const attrs = { class: `conv${current ? " active" : ""}`, dataset: { id: conversation.id } };
    return h("li", attrs, open, h("div", { class: "conv-actions" }, rename, remove));
  }

  #startRename(id) {
    this.renaming = id;
    this.render();
    const input = this.list.querySelector("input.rename");
    input?.focus();
    input?.select();
  }

  #renameInput(conversation) {
    const input = h("input", {
      type: "text",
      class: "rename",
      "aria-label": "Conversation title",
      maxlength: 200,
    });
    input.value = conversation.title;
    let finished = false;
    const finish = async (save) => {
      if (finished) return;
      finished = true;
      this.renaming = null;
      const title = input.value.trim();
      if (save && title && title !== conversation.title) await this.onRename(conversation.id, title);
      this.render();
      this.list.querySelector(`li[data-id="${CSS.escape(conversation.id)}"] .conv-open`)?.focus();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") finish(true);
      else if (event.key === "Escape") {
        event.stopPropagation();
        finish(false);
      }
    });
    input.addEventListener("blur", () => finish(true));
    return input;
  }

  #onKey(event) {
    if (!["ArrowDown", "ArrowUp", "Home", "End"].includes(event.key)) return;
    const buttons = [...this.list.querySelectorAll(".conv-open")];
    const at = buttons.indexOf(document.activeElement);
    if (at < 0) return;
    event.preventDefault();
    const next = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: buttons.length - 1 }[event.key];
    buttons[Math.max(0, Math.min(buttons.length - 1, next))].focus();
  }
}

function relativeTime(ms) {
  const seconds = Math.round((Date.now() - ms) / 1000);
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return new Date(ms).toLocaleDateString();
}
