// Conversations in IndexedDB, mirrored in memory (the list, search and the live streams all read the
// same objects). A write clones the conversation at call time, so what is stored is always a consistent
// snapshot: a message's text and its stream offset are saved together.
const DB_NAME = "llamba";
const DB_VERSION = 1;
const CONVERSATIONS = "conversations";

function done(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

function openDatabase() {
  const req = indexedDB.open(DB_NAME, DB_VERSION);
  req.onupgradeneeded = () => {
    const db = req.result;
    if (!db.objectStoreNames.contains(CONVERSATIONS)) {
      db.createObjectStore(CONVERSATIONS, { keyPath: "id" }).createIndex("updatedAt", "updatedAt");
    }
  };
  return done(req);
}

export async function openStore() {
  const db = await openDatabase();
  const all = await done(db.transaction(CONVERSATIONS).objectStore(CONVERSATIONS).getAll());
  return new Store(db, all);
}

export class Store {
  constructor(db, conversations) {
    this.db = db;
    this.items = new Map(conversations.map((c) => [c.id, c]));
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

  put(conversation) {
    this.items.set(conversation.id, conversation);
    return this.#write((store) => store.put(conversation));
  }

  delete(id) {
    this.items.delete(id);
    return this.#write((store) => store.delete(id));
  }

  /** Messages, in any conversation, that still have a stream to resume. */
  pendingStreams() {
    const out = [];
    for (const conversation of this.items.values()) {
      for (const message of conversation.messages) if (message.stream) out.push({ conversation, message });
    }
    return out;
  }

  #write(action) {
    const tx = this.db.transaction(CONVERSATIONS, "readwrite");
    action(tx.objectStore(CONVERSATIONS));
    return new Promise((resolve, reject) => {
      tx.oncomplete = () => resolve();
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error);
    });
  }
}
