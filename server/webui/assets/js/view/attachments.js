// The images attached to the message being written: the picker button, files dropped on the chat column
// and images pasted into the message box, each shown as a thumbnail with a remove button. Images are read
// as data: URLs, what the server takes in an `image_url` part (and what the page's CSP lets <img> show).
//
// Whether the model reads images comes from /props (`modalities.vision`): for a text-only model the
// button is disabled and an image dropped or pasted is refused with a visible notice, never dropped
// silently and never sent to the server (which would answer 400).
import { h, newId } from "../dom.js";
import { icon } from "../icons.js";

export const TEXT_ONLY = "This model reads text only: images cannot be attached";
const MAX_BYTES = 10 * 1024 * 1024; // one image; llama-server caps a fetched medium at 10 MB too
const ATTACH = "Attach images";

export class Attachments {
  /** `button` opens the file `input`; thumbnails go in `list`; refusals in `notice`; files dropped on
   * `dropZone` (highlighting `composer`) or pasted into `textarea` are attached; `onChange()` after each
   * change of the list. */
  constructor({ button, input, list, notice, dropZone, composer, textarea, onChange }) {
    Object.assign(this, { button, input, list, notice, composer, onChange });
    this.items = []; // [{id, name, url}], in the order they were attached
    this.vision = null; // from /props: true, false, or null while not known (the server decides)
    button.addEventListener("click", () => (this.vision === false ? this.notify(TEXT_ONLY) : input.click()));
    input.addEventListener("change", () => {
      const files = [...input.files];
      input.value = ""; // the same file can be picked again after removing it
      this.add(files);
    });
    dropZone.addEventListener("dragover", (event) => this.#dragOver(event));
    dropZone.addEventListener("dragleave", (event) => {
      if (!dropZone.contains(event.relatedTarget)) composer.classList.remove("dropping");
    });
    dropZone.addEventListener("drop", (event) => this.#drop(event));
    // A file dropped anywhere else would make the browser open it in place of the page (and its chats):
    // the drop is refused there, and says where to drop instead.
    window.addEventListener("dragover", (event) => hasFiles(event) && event.preventDefault());
    window.addEventListener("drop", (event) => {
      if (!hasFiles(event) || dropZone.contains(event.target)) return;
      event.preventDefault();
      this.notify("Drop images on the chat to attach them.");
    });
    textarea.addEventListener("paste", (event) => this.#paste(event));
    this.setVision(null);
  }

  /** The model's answer to "does it read images?"; false disables attaching (and drops any attached). */
  setVision(vision) {
    this.vision = vision;
    const off = vision === false;
    // aria-disabled, not disabled: the button keeps its tooltip on hover and a click explains itself.
    this.button.setAttribute("aria-disabled", String(off));
    this.button.title = off ? TEXT_ONLY : ATTACH;
    if (off && this.items.length) {
      this.items = [];
      this.#render();
      this.notify(`${TEXT_ONLY}: the attached images were removed`);
    }
  }

  /** Attach the images among `files`; anything refused is said in the notice. */
  async add(files) {
    if (!files.length) return;
    if (this.vision === false) {
      this.notify(TEXT_ONLY);
      return;
    }
    const problems = [];
    const wanted = files.filter((file) => {
      const name = file.name || "The pasted file";
      if (!file.type.startsWith("image/")) problems.push(`${name} is not an image`);
      else if (file.size > MAX_BYTES) problems.push(`${name} is over 10 MB`);
      else return true;
      return false;
    });
    const read = await Promise.all(
      wanted.map((file) =>
        readImage(file).catch((err) => {
          problems.push(`${file.name} could not be read (${err.message})`);
          return null;
        }),
      ),
    );
    this.items.push(...read.filter(Boolean));
    this.notify(problems.length ? `Not attached: ${problems.join("; ")}.` : "");
    this.#render();
  }

  /** The attached images, for the message being sent; the composer is left empty. */
  take() {
    const items = this.items;
    this.items = [];
    this.notify("");
    this.#render();
    return items;
  }

  notify(text) {
    this.notice.textContent = text;
    this.notice.hidden = !text;
  }

  #remove(id) {
    this.items = this.items.filter((item) => item.id !== id);
    this.#render();
    this.composer.querySelector("textarea")?.focus();
  }

  #render() {
    this.list.hidden = !this.items.length;
    this.list.replaceChildren(
      ...this.items.map(({ id, name, url }) =>
        h(
          "li",
          { class: "attachment" },
          h("img", { src: url, alt: name, title: name }),
          h(
            "button",
            {
              type: "button",
              class: "attachment-remove",
              "aria-label": `Remove ${name}`,
              onclick: () => this.#remove(id),
            },
            icon("x", 12),
          ),
        ),
      ),
    );
    this.onChange();
  }

  #dragOver(event) {
    if (!hasFiles(event)) return;
    event.preventDefault(); // allows the drop (on a text-only model too: the drop then says why it is refused)
    event.dataTransfer.dropEffect = "copy";
    this.composer.classList.add("dropping");
  }

  #drop(event) {
    this.composer.classList.remove("dropping");
    if (!hasFiles(event)) return;
    event.preventDefault();
    this.add([...event.dataTransfer.files]);
  }

  #paste(event) {
    const data = event.clipboardData;
    const files = [...(data?.files || [])];
    // Office apps put a picture of the copied text next to the text: with text on the clipboard, the text
    // is what was meant, and it pastes as usual.
    if (!files.length || data.getData("text/plain")) return;
    event.preventDefault();
    this.add(files);
  }
}

function hasFiles(event) {
  return Boolean(event.dataTransfer?.types?.includes("Files"));
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve({ id: newId(), name: file.name || "image", url: reader.result });
    reader.onerror = () => reject(reader.error || new Error("unreadable"));
    reader.readAsDataURL(file);
  });
}
