"""Programs an SM can hold, as the driver sees them (run 81): qwen3-8b's decode graphs at `--parallel`
(default 64) captured, then every compiled variant of the Triton kernels the round launches: registers,
spills, shared memory, warps, and cuOccupancyMaxActiveBlocksPerMultiprocessor at the preferred carveout
the kernel was left with.

    PYTHONPATH=. python3 -m engine.dev.occupancy --out $OUT [--parallel 64 --max-len 1024]
"""
from __future__ import annotations

import ctypes
import json
import sys

from engine.config import EngineConfig
from engine.runner import build_runner


def occupancy(kernel) -> int:
    n = ctypes.c_int(0)
    warps = kernel.metadata.num_warps
    rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(n), ctypes.c_void_p(kernel.function), ctypes.c_int(32 * warps), ctypes.c_size_t(kernel.metadata.shared))
    return n.value if rc == 0 else -rc


def main(argv):
    def arg(name, default):
        return int(argv[argv.index(name) + 1]) if name in argv else default
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    parallel, max_len = arg("--parallel", 64), arg("--max-len", 1024)
    build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=parallel,
                              max_model_len=max_len, prefill_rows=min(4096, max_len)))
    import engine.kernels as K
    import engine.kernels_fused as KF
    import engine.kernels_skinny as S
    fns = {"split": K._split_kernel, "skinny": S._skinny_kernel}
    fns.update({n: getattr(KF, n) for n in dir(KF) if n.startswith("_") and n.endswith("_kernel")})
    res = []
    for name, fn in fns.items():
        for device, (cache, *_rest) in getattr(fn, "device_caches", {}).items():
            for kernel in cache.values():
                kernel._init_handles()
                res.append({"kernel": name, "regs": kernel.n_regs, "spills": kernel.n_spills,
                            "shared": kernel.metadata.shared, "warps": kernel.metadata.num_warps,
                            "per_sm": occupancy(kernel)})
    for row in res:
        print(row, flush=True)
    with open(f"{out}/occupancy.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
