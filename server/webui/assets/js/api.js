// The server's HTTP API, with the API key when one is set, and an SSE splitter that counts bytes.
// Paths are relative to the page's folder, so the UI works under --api-prefix (/llm/ serves it there).
const BASE = new URL(".", document.baseURI).pathname.replace(/\/$/, "");
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export class Api {
  constructor(settings) {
    this.settings = settings;
  }

  headers(extra = {}) {
    const key = this.settings.get("apiKey");
    return key ? { Authorization: `Bearer ${key}`, ...extra } : extra;
  }

  async json(path, options = {}) {
    const response = await fetch(BASE + path, { ...options, headers: this.headers(options.headers) });
    if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
    return response.json();
  }

  props() {
    return this.json("/props");
  }

  /** Router mode: the models and their status; load one. */
  models() {
    return this.json("/models");
  }

  loadModel(model) {
    return this.json("/models/load", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model }),
    });
  }

  /** Router mode: call `onEvent` with each /models/sse event until the stream ends. */
  async modelEvents(onEvent) {
    const response = await fetch(BASE + "/models/sse", { headers: this.headers(), cache: "no-store" });
    if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      pending += decoder.decode(value, { stream: true });
      let end;
      while ((end = pending.indexOf("\n\n")) >= 0) {
        const event = pending.slice(0, end);
        pending = pending.slice(end + 2);
        if (event.startsWith("data: ")) onEvent(JSON.parse(event.slice(6)));
      }
    }
  }

  /** The MCP servers' tools (GET /tools), or [] when the server has none configured (404). */
  async tools() {
    const response = await fetch(BASE + "/tools", { headers: this.headers() });
    if (response.status === 404) return [];
    if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
    return response.json();
  }

  /** Start a streamed chat completion as the resumable session `key`. Resolves to the raw Response. */
  chat(body, key, signal) {
    return fetch(BASE + "/v1/chat/completions", {
      method: "POST",
      headers: this.headers({ "Content-Type": "application/json", "X-Conversation-Id": key }),
      body: JSON.stringify(body),
      signal,
    });
  }

  /** Reattach to session `key` from byte `offset`: 200 (bytes follow), 503 (loading) or 404 (gone). */
  stream(key, offset, signal) {
    const query = new URLSearchParams({ conv_id: key, from: String(offset) });
    return fetch(`${BASE}/v1/stream?${query}`, { headers: this.headers(), signal, cache: "no-store" });
  }

  stop(key) {
    const query = new URLSearchParams({ conv_id: key });
    return fetch(`${BASE}/v1/stream?${query}`, { method: "DELETE", headers: this.headers() });
  }

  control(id, action) {
    return this.json("/v1/chat/completions/control", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ id, action }),
    });
  }
}

export async function errorMessage(response) {
  const text = await response.text().catch(() => "");
  try {
    const body = JSON.parse(text);
    return body.error?.message || body.message || text || `HTTP ${response.status}`;
  } catch {
    return text.slice(0, 300) || `HTTP ${response.status}`;
  }
}

/** Splits an SSE byte stream into whole events ("...\n\n"), each with its exact length in bytes. */
export class SseSplitter {
  constructor() {
    this.pending = new Uint8Array(0);
    this.decoder = new TextDecoder();
  }

  /** Feed bytes; returns the complete events now available as [{text, bytes}]. */
  push(chunk) {
    const joined = new Uint8Array(this.pending.length + chunk.length);
    joined.set(this.pending);
    joined.set(chunk, this.pending.length);
    const events = [];
    let start = 0;
    for (let i = 1; i < joined.length; i += 1) {
      if (joined[i] === 10 && joined[i - 1] === 10 && i - 1 >= start) {
        events.push({ text: this.decoder.decode(joined.subarray(start, i + 1)), bytes: i + 1 - start });
        start = i + 1;
      }
    }
    this.pending = joined.slice(start);
    return events;
  }
}
