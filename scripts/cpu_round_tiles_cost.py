"""What the decode round's 8-row tiles cost, in one process (cpu preset, one thread, --parallel 4,
lanes at position 300), and whether each way of multiplying gives the tiles' bits:

- `rows=P`: weights packed for, and rounds of, the lane count's rows (engine 9799600; P = 1 is
  the plain reference's --parallel 1, P = 4 a server's);
- `tile8`: main's rounds of whole ROW_TILE tiles;
- `min4`: weights packed for 8 rows, called at max(4, rows) rows (not in the engine: MKL's float32
  sgemm has one kernel for 1 to 3 rows and another for 4 or more, whose rows do not depend on the
  row count or place, so this keeps tile8's bits at rows=4's cost).

    PYTHONPATH=. python scripts/cpu_round_tiles_cost.py float32|bfloat16
"""
import statistics
import sys
import time
import types

import torch

import engine.cpu.kernels as ck
from engine.config import EngineConfig
from engine.runner.model_runner import build_runner


def mm_any(self, x, key):
    if self.bf16:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed[key], None, "none", [], "")
    return torch.ops.mkl._mkl_linear(x, self.packed[key], self.plain[key], None, x.shape[0])


def variants(r) -> dict:
    out = {"tile8": (r.cpu_mm, ck.ROW_TILE)}
    for rows in (1, 4):
        ck.ROW_TILE = rows  # PackedLinears packs for ROW_TILE rows
        old = ck.PackedLinears(r.model)
        ck.ROW_TILE = out["tile8"][1]
        old.mm_tiled = old.mm  # the round's rows in one call
        out[f"rows={rows}"] = (old, rows)
    min4 = ck.PackedLinears(r.model)
    min4.mm_tiled = types.MethodType(mm_any, min4)
    out["min4"] = (min4, 4)
    return out


def main(dtype: str) -> None:
    torch.set_num_threads(1)
    r = build_runner(EngineConfig(model="cpu", dtype=dtype, parallel=4, max_model_len=1024, seed=1234))
    ways = variants(r)
    for lane in range(4):
        r.prefill(lane, [(i * 31 + lane) % 500 for i in range(300)])

    def round_(name, k):
        r.cpu_mm, r.round_rows = ways[name]
        rows, _ = r._padded(list(range(k)), [7] * k, [300] * k)
        with torch.inference_mode():
            return r._decode_body(torch.tensor(rows), rows=list(zip(rows[2], rows[1])))[:k]

    cases = [("rows=1", 1), ("rows=4", 1), ("min4", 1), ("tile8", 1), ("rows=4", 4), ("min4", 4), ("tile8", 4)]
    times = {c: [] for c in cases}
    for _ in range(80):  # interleaved, so load changes hit every way alike
        for c in cases:
            s = time.perf_counter()
            round_(*c)
            times[c].append(time.perf_counter() - s)
    for name, k in cases:
        same = torch.equal(round_(name, k), round_("tile8", k))
        ms = statistics.median(times[(name, k)][3:]) * 1e3
        print(f"{dtype} {name:7s} {k} active: {ms:6.1f} ms a round (median), tile8's bits: {same}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "float32")
