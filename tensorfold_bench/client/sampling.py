"""What every request samples with: `--temperature T --seed S`.

T = 0 (the default) is greedy and sends no seed. T > 0 sends T and a per-request seed derived
from S and the request's role (long-prompt's A, B, C; a sweep prompt's key `sweep:c0s1`), so
the same prompt gets the same seed on every server, run and variant and in the plain
reference: a server whose sampled token depends only on (seed, position, logits) then keeps
sampled replies exactly as greedy ones, and the same hash checks cover them.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

from tensorfold_bench.client.stream import Request
from tensorfold_bench.errors import FlagError

SEED_RULE = "int.from_bytes(sha256(b'{S}:sample:{role}')[:8], 'little') >> 1; role A, B, C or sweep:c{cell}s{stream}"


def request_seed(seed: int, role: str) -> int:
    """The seed a request in `role` sends: 63 bits, so any server's int64 seed takes it."""
    digest = hashlib.sha256(f"{seed}:sample:{role}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t >= 0):
            raise FlagError("--temperature", f"must be a finite number >= 0, not {t!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise FlagError("--seed", f"must be an integer, not {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def apply(self, req: Request, role: str) -> Request:
        """`req` sampling as this says: greedy unchanged; else T and the role's seed."""
        if self.greedy:
            return req
        return replace(req, temperature=float(self.temperature), seed=request_seed(self.seed, role))

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "seed": self.seed, "request_seed": None if self.greedy else SEED_RULE}


GREEDY = Sampling()
