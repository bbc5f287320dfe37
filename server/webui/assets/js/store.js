// Conversations in IndexedDB, mirrored in memory (the list, search and the live streams all read the
// same objects). A write clones the conversation at call time, so what is stored is always a consistent
// snapshot: a message's text and its stream offset are saved together.
//
// Attached images and audio files (data: URLs of up to a few MB) live in their own object store (named
// "images" for both), written once with the conversation that first holds them: the conversation record
// keeps only their ids, names (and an audio file's kind and format), so the saves while an answer streams
// (every 250 ms) stay small. In memory, a message's `images` (audio files among them) carry their URL.
//
// Version 3 stores each conversation as a message tree (tree.js: every message's `parent`, the shown
// branch's `leaf`); the upgrade turns each older, flat conversation into one branch.
import { normalize } from "./tree.js";

const DB_NAME = "llamba";
const DB_VERSION = 3; // 2: the images store; 3: message trees
const CONVERSATIONS = "conversations";
const IMAGES = "images";

function done(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

function openDatabase(onBlocked) {
  const req = indexedDB.open(DB_NAME, DB_VERSION);
  // A tab of an older version holds the database open: the upgrade waits until it is closed.
  req.onblocked = () => onBlocked();
  req.onupgradeneeded = (event) => {
    const db = req.result;
    if (!db.objectStoreNames.contains(CONVERSATIONS)) {
      db.createObjectStore(CONVERSATIONS, { keyPath: "id" }).createIndex("updatedAt", "updatedAt");
    } else if (event.oldVersion < 3) {
      // flat conversations (versions 1, 2) become trees of one branch, in the upgrade's own transaction
      req.transaction.objectStore(CONVERSATIONS).openCursor().onsuccess = (e) => {
        const cursor = e.target.result;
        if (!cursor) return;
        cursor.update(normalize(cursor.value));
        cursor.continue();
      };
    }
    if (!db.objectStoreNames.contains(IMAGES)) db.createObjectStore(IMAGES, { keyPath: "id" });
  };
  return done(req);
}

/** `onBlocked()`: the database waits for another tab (an older Llamba) to close. */
export async function openStore(onBlocked = () => {}) {
  const db = await openDatabase(onBlocked);
  // A newer version opened in another tab: let it upgrade; this tab's writes fail from then on, and say so.
  db.onversionchange = () => db.close();
  const tx = db.transaction([CONVERSATIONS, IMAGES]);
  const [all, images] = await Promise.all([
    done(tx.objectStore(CONVERSATIONS).getAll()),
    done(tx.objectStore(IMAGES).getAll()),
  ]);
  const urls = new Map(images.map((image) => [image.id, image.url]));
  for (const conversation of all) {
    normalize(conversation);
    for (const image of imagesOf(conversation)) image.url = urls.get(image.id) || "";
  }
  return new Store(db, all, new Set(urls.keys()));
}

/** Every image attached to the conversation's messages (every branch's). */
function imagesOf(conversation) {
  return conversation.messages.flatMap((m) => m.images || []);
}

export class Store {
  constructor(db, conversations, savedImages = new Set()) {
    this.db = db;
    this.items = new Map(conversations.map((c) => [c.id, c]));
    this.savedImages = savedImages; // ids of the images already in IndexedDB
    // conversation id -> the ids of the images its stored record holds (a deleted branch's go with it)
    this.stored = new Map(conversations.map((c) => [c.id, new Set(imagesOf(c).map((i) => i.id))]));
    this.failing = new Set(); // conversation ids whose last write failed
    // Called as onError(conversation, error) when a conversation stops being saved (quota exceeded,
    // storage off), once until it is saved again: it stays in memory, the app says so.
    this.onError = () => {};
  }

  /** Conversations, most recently updated first; `query` filters on title and message text. */
  list(query = "") {
    const needle = query.trim().toLowerCase();
    const all = [...this.items.values()].sort((a, b) => b.updatedAt - a.updatedAt);
    if (!needle) return all;
    return all.filter(
      (c) =>
        c.title.toLowerCase().includes(needle) ||
        c.messages.some((m) => (m.content || "").toLowerCase().includes(needle)),
    );
  }

  get(id) {
    return this.items.get(id) || null;
  }

  /** Save the conversation, with its images not stored yet; resolves to false (and reports through
   * onError) when the browser refused the write: the conversation is still in memory. */
  async put(conversation) {
    normalize(conversation);
    const before = this.items.get(conversation.id);
    this.items.set(conversation.id, conversation);
    const images = imagesOf(conversation);
    const fresh = images.filter((image) => image.url && !this.savedImages.has(image.id));
    // Images no message holds any more (a deleted branch; a conversation replaced by an import) go.
    const kept = new Set(images.map((image) => image.id));
    const had = new Set([
      ...(this.stored.get(conversation.id) || []),
      ...(before && before !== conversation ? imagesOf(before).map((image) => image.id) : []),
    ]);
    const dropped = [...had].filter((id) => !kept.has(id));
    const record = {
      ...conversation,
      messages: conversation.messages.map((m) =>
        m.images ? { ...m, images: m.images.map(({ url, ...rest }) => rest) } : m,
      ),
    };
    const saved = await this.#write(conversation, (tx) => {
      tx.objectStore(CONVERSATIONS).put(record);
      for (const { id, url } of fresh) tx.objectStore(IMAGES).put({ id, url });
      for (const id of dropped) tx.objectStore(IMAGES).delete(id);
    });
    if (saved) {
      for (const { id } of fresh) this.savedImages.add(id);
      for (const id of dropped) this.savedImages.delete(id);
      this.stored.set(conversation.id, kept);
    }
    return saved;
  }

  async delete(id) {
    const conversation = this.items.get(id);
    this.items.delete(id);
    const images = conversation ? imagesOf(conversation).map((image) => image.id) : [];
    const deleted = await this.#write(conversation, (tx) => {
      tx.objectStore(CONVERSATIONS).delete(id);
      for (const imageId of images) tx.objectStore(IMAGES).delete(imageId);
    });
    if (deleted) {
      for (const imageId of images) this.savedImages.delete(imageId);
      this.stored.delete(id);
    }
    return deleted;
  }

  /** Messages, in any conversation, that still have a stream to resume. */
  pendingStreams() {
    const out = [];
    for (const conversation of this.items.values()) {
      for (const message of conversation.messages) if (message.stream) out.push({ conversation, message });
    }
    return out;
  }

  /** One transaction over both stores; true once it committed. */
  #write(conversation, action) {
    return new Promise((resolve) => {
      const failed = (error) => {
        if (conversation && !this.failing.has(conversation.id)) {
          this.failing.add(conversation.id);
          this.onError(conversation, error);
        }
        resolve(false);
      };
      let tx;
      try {
        tx = this.db.transaction([CONVERSATIONS, IMAGES], "readwrite");
        action(tx);
      } catch (error) {
        try {
          tx?.abort();
        } catch {
          /* not started, or already over */
        }
        failed(error); // a value that cannot be cloned, a closed database
        return;
      }
      tx.oncomplete = () => {
        if (conversation) this.failing.delete(conversation.id);
        resolve(true);
      };
      tx.onabort = () => failed(tx.error || new Error("the write was aborted"));
    });
  }
}
