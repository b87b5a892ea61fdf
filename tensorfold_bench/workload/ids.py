"""Seeded random token ids and generators, keyed by text: the same (seed, key) gives the same draw
in every process, so every run and variant sends the same prompts."""
from __future__ import annotations

import hashlib

import numpy as np

PROMPT_ID_FLOOR = 256  # stay clear of the low (byte / special) ids


def rng(seed: int, key: str) -> np.random.Generator:
    """A generator seeded by (seed, key): independent draws for each key, stable across processes."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def prompt_ids(seed: int, key: str, n: int, vocab: int) -> list[int]:
    """n random token ids in [PROMPT_ID_FLOOR, vocab), from a generator seeded by (seed, key)."""
    lo = min(PROMPT_ID_FLOOR, max(vocab // 4, 0))
    return rng(seed, key).integers(lo, vocab, size=n).tolist()
