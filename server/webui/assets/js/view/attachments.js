// The files attached to the message being written: the picker button, files dropped on the chat column
// and files pasted into the message box, each shown as a thumbnail (an image) or a chip (an audio file,
// a text file or a PDF: its icon and name) with a remove button. Files are read as data: URLs: an image's is
// what the server takes in an `image_url` part (and what the page's CSP lets <img> show); an audio file's
// base64 goes out in an `input_audio` part (chat.js). An audio item is {id, name, url, kind: "audio",
// format}; an image {id, name, url}. (No <audio> preview: the page's CSP lets no media load data: URLs.)
//
// Text files (by type or extension, up to 1 MB, no NUL bytes) and PDFs (their text, read by pdf.js:
// pdf-text.js) are read into the message as text: {id, name, kind: "text" | "pdf", text}; any model takes
// them. A paste of more than PASTE_AS_FILE characters becomes a text file too (llama.cpp's "paste long
// text as a file").
//
// Which kinds the model reads comes from /props (`modalities.vision`, `modalities.audio`): a kind it does
// not read is refused with a visible notice, never dropped silently and never sent to the server (which
// would answer 400); for a model that reads neither the button is disabled.
import { h, newId } from "../dom.js";
import { icon } from "../icons.js";

export const TEXT_ONLY = "This model reads text only: images cannot be attached";
export const NO_IMAGES = "This model does not read images: images cannot be attached";
export const NO_AUDIO = "This model does not read audio: audio cannot be attached";
const MAX_BYTES = 10 * 1024 * 1024; // one file; llama-server caps a fetched medium at 10 MB too
const MAX_TEXT_BYTES = 1024 * 1024; // a text file read into the prompt
export const PASTE_AS_FILE = 2000; // characters: a longer paste becomes an attached text file
const TEXT_TYPES = /^(text\/|application\/(json|ld\+json|xml|javascript|x-javascript|x-sh|x-shellscript|x-yaml|yaml|toml|x-toml|sql|x-python|x-httpd-php|x-tex|x-latex|csv|x-ndjson|graphql|x-perl|x-ruby)\b)/;
const TEXT_EXTENSIONS = new Set(
  (
    "txt md markdown rst org log csv tsv json jsonl ndjson yaml yml toml ini cfg conf env xml html htm css " +
    "scss less js mjs cjs jsx ts tsx vue svelte py pyi ipynb rb php pl lua r jl go rs c h cc cpp cxx hpp hh " +
    "cs java kt kts scala swift m mm dart sh bash zsh fish ps1 bat cmd sql graphql gql proto tex bib diff " +
    "patch cmake make mk gradle dockerfile tf hcl nix el clj ex exs erl hs ml fs vim asm s gitignore"
  ).split(" "),
);
const AUDIO_FORMATS = { wav: "wav", wave: "wav", "x-wav": "wav", "vnd.wave": "wav", mpeg: "mp3", mp3: "mp3" };
Object.assign(AUDIO_FORMATS, { "x-mp3": "mp3", "x-mpeg": "mp3", flac: "flac", "x-flac": "flac" });

export class Attachments {
  /** `button` opens the file `input`; thumbnails go in `list`; refusals in `notice`; files dropped on
   * `dropZone` (highlighting `composer`) or pasted into `textarea` are attached; `onChange()` after each
   * change of the list. */
  constructor({ button, input, list, notice, dropZone, composer, textarea, onChange }) {
    Object.assign(this, { button, input, list, notice, composer, onChange });
    // [{id, name, url, kind?, format?}] (an image or audio file) or [{id, name, kind, text}] (a text file
    // or PDF), in the order they were attached
    this.items = [];
    this.pastes = 0;
    // from /props: true, false, or null while not known (the server decides)
    this.vision = null;
    this.audio = null;
    button.addEventListener("click", () => input.click());
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
      this.notify("Drop files on the chat to attach them.");
    });
    textarea.addEventListener("paste", (event) => this.#paste(event));
    this.setModalities({ vision: null, audio: null });
  }

  /** The model's answers to "does it read images? audio?" (true, false or null: not known); a kind it
   * does not read cannot be attached (any attached are dropped); neither disables the button. */
  setModalities({ vision = null, audio = null }) {
    Object.assign(this, { vision, audio });
    const off = this.#readsNothing();
    this.button.setAttribute("aria-label", "Attach files");
    const kinds = [vision !== false && "images", audio === true && "audio", "text files", "PDFs"];
    const named = kinds.filter(Boolean);
    this.button.title = `Attach ${named.slice(0, -1).join(", ")} or ${named.at(-1)}`;
    const media = [vision !== false && "image/*", audio !== false && "audio/*"].filter(Boolean);
    const text = [...TEXT_EXTENSIONS].map((ext) => `.${ext}`);
    this.input.accept = [...media, "text/*", "application/json", "application/pdf", ".pdf", ...text].join(",");
    const kept = this.items.filter((item) => this.#refusal(item.kind || "image") === "");
    if (kept.length !== this.items.length) {
      const gone = this.items.filter((item) => !kept.includes(item));
      this.items = kept;
      this.#render();
      const audio = gone.filter((item) => item.kind === "audio").length;
      const why = off ? TEXT_ONLY : audio ? NO_AUDIO : NO_IMAGES;
      const what = !audio ? "images" : audio === gone.length ? "audio files" : "files";
      this.notify(`${why}: the attached ${what} were removed`);
    }
  }

  /** Kept for callers that know only about images. */
  setVision(vision) {
    this.setModalities({ vision, audio: this.audio });
  }

  /** Attach the files among `files` the model can take; anything refused is said in the notice. */
  async add(files) {
    if (!files.length) return;
    const refusals = new Set();
    const problems = [];
    const wanted = files.filter((file) => {
      const name = file.name || "The pasted file";
      const kind = kindOf(file);
      const refusal = this.#refusal(kind);
      if (refusal) refusals.add(refusal);
      else if (!kind) problems.push(`${name} is not ${this.#readable()}`);
      else if (kind === "text" && file.size > MAX_TEXT_BYTES) problems.push(`${name} is over 1 MB`);
      else if (file.size > MAX_BYTES) problems.push(`${name} is over 10 MB`);
      else return true;
      return false;
    });
    const read = await Promise.all(
      wanted.map((file) =>
        readFile(file).catch((err) => {
          problems.push(`${file.name} could not be read (${err.message})`);
          return null;
        }),
      ),
    );
    this.items.push(...read.filter(Boolean));
    const said = problems.length ? `Not attached: ${problems.join("; ")}.` : "";
    this.notify([...refusals, said].filter(Boolean).join(" "));
    this.#render();
  }

  /** What a file must be, said for a refusal. */
  #readable() {
    const kinds = [this.vision !== false && "an image", this.audio === true && "an audio file"];
    const all = [...kinds.filter(Boolean), "a text file", "a PDF"];
    return `${all.slice(0, -1).join(", ")} or ${all.at(-1)}`;
  }

  #readsNothing() {
    return this.vision === false && this.audio === false;
  }

  /** Why a file of `kind` ("image", "audio", or null: neither) cannot be attached, or "". */
  #refusal(kind) {
    if (kind === "text" || kind === "pdf") return "";
    if (this.#readsNothing() && kind !== "audio") return TEXT_ONLY;
    if (kind === "image" && this.vision === false) return NO_IMAGES;
    if (kind === "audio" && this.audio === false) return NO_AUDIO;
    return "";
  }

  /** The attached files, for the message being sent; the composer is left empty. */
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
      ...this.items.map(({ id, name, url, kind, text }) =>
        h(
          "li",
          { class: kind && kind !== "image" ? `attachment attachment-${kind}` : "attachment" },
          kind === "audio"
            ? audioChip(name)
            : kind === "text" || kind === "pdf"
              ? fileChip({ name, kind, text })
              : h("img", { src: url, alt: name, title: name }),
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
    const text = data?.getData("text/plain") || "";
    if (text.length > PASTE_AS_FILE) {
      // a long paste (a log, a file's text) is attached as a text file, not poured into the box
      event.preventDefault();
      this.pastes += 1;
      const name = `pasted-${this.pastes}.txt`;
      this.items.push({ id: newId(), name, kind: "text", text });
      this.notify("");
      this.#render();
      return;
    }
    // Office apps put a picture of the copied text next to the text: with text on the clipboard, the text
    // is what was meant, and it pastes as usual.
    if (!files.length || text) return;
    event.preventDefault();
    this.add(files);
  }
}

function hasFiles(event) {
  return Boolean(event.dataTransfer?.types?.includes("Files"));
}

/** "image", "audio", "pdf", "text" (by its type, or its name where the browser gives no type or a
 * generic one), or null. */
function kindOf(file) {
  const type = file.type || "";
  const ext = /\.([^./]+)$/.exec(file.name || "")?.[1].toLowerCase() || "";
  if (type.startsWith("image/")) return "image";
  if (type.startsWith("audio/") || (!type && audioFormat(file))) return "audio";
  if (type === "application/pdf" || ext === "pdf") return "pdf";
  if (TEXT_TYPES.test(type) || TEXT_EXTENSIONS.has(ext) || /^(Dockerfile|Makefile)$/i.test(file.name || ""))
    return "text";
  return null;
}

/** The `format` of an `input_audio` part: wav, mp3 or flac from the name or the type (the server reads
 * the bytes whatever it says). */
function audioFormat(file) {
  const ext = /\.(wav|mp3|flac)$/i.exec(file.name || "");
  if (ext) return ext[1].toLowerCase();
  return AUDIO_FORMATS[file.type.replace(/^audio\//, "").toLowerCase()] || "";
}

/** An audio attachment as a chip: its icon and name. */
export function audioChip(name) {
  return h(
    "span",
    { class: "audio-chip", title: name },
    icon("audio", 16),
    h("span", { class: "audio-name" }, name),
  );
}

/** A text file or PDF as a chip: its icon and name (and its size in characters, as a tooltip). */
export function fileChip({ name, kind, text }) {
  const what = kind === "pdf" ? "PDF" : "text file";
  return h(
    "span",
    { class: "file-chip", title: `${name}: ${what}, ${(text || "").length} characters` },
    icon("file", 16),
    h("span", { class: "file-name" }, name),
  );
}

async function readFile(file) {
  const kind = kindOf(file);
  if (kind === "text") {
    const text = await file.text();
    if (text.includes("\u0000")) throw new Error("it is not text");
    return { id: newId(), name: file.name || "file.txt", kind: "text", text };
  }
  if (kind === "pdf") {
    const { pdfText } = await import("../pdf-text.js");
    const text = await pdfText(new Uint8Array(await file.arrayBuffer()));
    if (!text.trim()) throw new Error("it has no text: a scanned PDF?");
    return { id: newId(), name: file.name || "file.pdf", kind: "pdf", text };
  }
  return readMedia(file);
}

function readMedia(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    const audio = kindOf(file) === "audio";
    reader.onload = () => {
      const id = newId();
      const format = audioFormat(file) || "wav";
      if (audio) resolve({ id, name: file.name || "audio", url: reader.result, kind: "audio", format });
      else resolve({ id, name: file.name || "image", url: reader.result });
    };
    reader.onerror = () => reject(reader.error || new Error("unreadable"));
    reader.readAsDataURL(file);
  });
}
