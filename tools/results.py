"""How a device probe ends: its wall time kept with its figures, and the figures written where
--out says (the folder a device call brings back)."""
from __future__ import annotations

import json
import time


def write_results(res: dict, t0: float, out: str | None) -> None:
    res["total_s"] = round(time.perf_counter() - t0, 1)
    if out:
        with open(out, "w") as fh:
            json.dump(res, fh, indent=1)
