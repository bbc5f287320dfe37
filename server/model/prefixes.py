"""A prompt cache's compact summary: chained hashes of fixed-size token blocks.

Hash k covers tokens [0, (k+1) * BLOCK_TOKENS): it is the hash of hash k-1 and block k, so two prompts
share hash k exactly when they share their first k+1 blocks (as vLLM's and SGLang's block hashes). A
replica reports the hashes of every prefix its slots and host prompt cache hold; the router hashes a new
prompt the same way and counts how many of its leading hashes a replica has: that many blocks of it would
be reused there. Only whole blocks count, so a summary is small (a 2k-token prompt is 32 hashes).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable

BLOCK_TOKENS = 64
HASH_BYTES = 8  # 64-bit hashes: a false match needs a collision among a few thousand entries


def block_hashes(tokens: Iterable[int]) -> list[str]:
    """The chained hash of each whole block of `tokens`, first block first."""
    tokens = list(tokens)
    hashes: list[str] = []
    previous = b""
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        block = array("l", tokens[start : start + BLOCK_TOKENS]).tobytes()
        digest = hashlib.blake2b(previous + block, digest_size=HASH_BYTES).digest()
        hashes.append(digest.hex())
        previous = digest
    return hashes


def summary_hashes(prompts: Iterable[Iterable[int]]) -> set[str]:
    """Every block-prefix hash of every cached prompt."""
    found: set[str] = set()
    for tokens in prompts:
        found.update(block_hashes(tokens))
    return found


def matched_blocks(prompt_hashes: list[str], cached: set[str]) -> int:
    """How many leading blocks of the prompt a replica with these cached hashes holds."""
    n = 0
    for h in prompt_hashes:
        if h not in cached:
            break
        n += 1
    return n
