// A conversation's messages as a tree, as llama.cpp's web UI keeps them: every message names its
// `parent` (the message it follows; null for a first message), so an edited question is a sibling of
// the one it replaces and a regenerated answer a sibling of the old answer. `conversation.messages`
// holds every message of every branch (in the order they were written); `conversation.leaf` is the
// last message of the branch shown, whose path from the root is what the thread draws and what a
// request sends.
//
// A conversation stored before branches existed (no `leaf`) is one branch: each message follows the
// one before it.

/** Give a conversation from any version its tree fields (in place; the same conversation back). */
export function normalize(conversation) {
  const messages = conversation.messages || (conversation.messages = []);
  if (conversation.leaf === undefined) {
    messages.forEach((m, i) => (m.parent = i ? messages[i - 1].id : null));
    conversation.leaf = messages.at(-1)?.id ?? null;
    return conversation;
  }
  const ids = new Set(messages.map((m) => m.id));
  for (const m of messages) if (typeof m.parent !== "string" || !ids.has(m.parent)) m.parent = null;
  if (!ids.has(conversation.leaf)) conversation.leaf = messages.at(-1)?.id ?? null;
  return conversation;
}

function byId(conversation) {
  return new Map(conversation.messages.map((m) => [m.id, m]));
}

/** The shown branch: the messages from the root to `leaf` (a broken chain, or a cycle, ends it). */
export function pathOf(conversation, leaf = conversation?.leaf) {
  if (!conversation || leaf == null) return [];
  const index = byId(conversation);
  const path = [];
  const seen = new Set();
  for (let m = index.get(leaf); m && !seen.has(m.id); m = m.parent ? index.get(m.parent) : null) {
    seen.add(m.id);
    path.push(m);
  }
  return path.reverse();
}

/** The messages that follow `parentId` (null: the first messages), oldest first. */
export function childrenOf(conversation, parentId) {
  return conversation.messages.filter((m) => (m.parent ?? null) === (parentId ?? null));
}

/** The message and its siblings (the versions to switch between), oldest first. */
export function siblingsOf(conversation, message) {
  return childrenOf(conversation, message.parent);
}

/** The last message of the branch under `message`, following the newest child at each step. */
export function lastLeafUnder(conversation, message) {
  let at = message;
  const seen = new Set();
  for (;;) {
    seen.add(at.id);
    const next = childrenOf(conversation, at.id).at(-1);
    if (!next || seen.has(next.id)) return at;
    at = next;
  }
}

/** The ids of `message` and every message under it. */
export function subtreeIds(conversation, message) {
  const ids = new Set([message.id]);
  let grown = true;
  while (grown) {
    grown = false;
    for (const m of conversation.messages) {
      if (m.parent && ids.has(m.parent) && !ids.has(m.id)) {
        ids.add(m.id);
        grown = true;
      }
    }
  }
  return ids;
}
