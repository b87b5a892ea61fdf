"""The CPU decode round's attention as plain C (engine/cpu/decode_attention.c), compiled once with `cc`.

The batched-matmul attention (engine.cpu.packed.decode_attention_buckets) multiplies K by a
block-diagonal Q and P^T by V, KV-heads times the arithmetic needed, on strided views the
libraries copy. The C kernel does each row's own arithmetic once, every sum in an order its
source writes (vector extensions, -ffp-contract=off, no -ffast-math), so its bits depend on the
source, not on the machine's vector width. Both decode rounds call the same compiled function:
the Python round through ctypes (which drops the GIL), the C++ round (engine/cpu/round.cpp)
through its address, so the two stay bit for bit equal.

A runner's kernels (engine/cpu/packed.py CpuKernels) choose once, before the first forward
(`kernel(toolchain)`): with a C compiler the kernel (built in about a second into the cache the
C++ round uses, keyed by the source), else, or when the build fails, or with the toolchain's C
kernels off (TFENGINE_NO_CC=1 at the CLI), the batched-matmul path; /v1/engine's
`decode_attention` says which.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import torch

from engine.config import Toolchain
from engine.cpu import isa

log = logging.getLogger("engine.cpu.decode_attention")

SOURCE = Path(__file__).with_name("decode_attention.c")
# built into the same library: the C++ round's elementwise passes and the widened-bf16 products
# (engine/cpu/wide.c), and the vector helpers both include
SOURCES = (SOURCE, SOURCE.with_name("elem.c"), SOURCE.with_name("wide.c"))
HEADER = SOURCE.with_name("vec.h")
FLAGS = ["-O2", "-march=native", "-ffp-contract=off", "-shared", "-fPIC"]


def flags() -> list[str]:
    """FLAGS, and below an --cpu-isa cap what keeps the build at torch's ISA (engine.cpu.isa)."""
    return [*FLAGS, *isa.c_flags()]
NAME = "tfe_decode_attention"
C_KERNEL, BMM = "c kernel", "bmm: batched matmuls a span group"


def build_once(so: Path, make: Callable[[Path], None]) -> Path:
    """`so`, made by make(scratch folder) unless the cache has it: one build at a time per cache
    entry (a file lock: servers started together wait for the first), into a scratch folder
    renamed into place, so a build killed midway leaves nothing half done."""
    if so.is_file():
        return so
    so.parent.mkdir(parents=True, exist_ok=True)
    with open(so.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so.is_file():
            return so
        scratch = Path(tempfile.mkdtemp(prefix="build-", dir=so.parent))
        try:
            make(scratch)
            if not (scratch / so.name).is_file():
                raise RuntimeError("the build wrote no library")
            os.replace(scratch / so.name, so)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return so


def library(tc: Toolchain) -> Path:
    text = b"".join(p.read_bytes() for p in (*SOURCES, HEADER))
    key = hashlib.sha256(text + " ".join([tc.cc, *flags()]).encode()).hexdigest()[:16]
    return tc.cache_dir() / f"cpu_attn-{key}" / "libtfe_attn.so"


def build(tc: Toolchain) -> Path:
    """The compiled kernel (about a second the first time). Raises RuntimeError saying why not."""
    cc = tc.cc
    if not shutil.which(cc):
        raise RuntimeError(f"no C compiler ({cc}) on PATH")

    def make(scratch: Path) -> None:
        r = subprocess.run([cc, *flags(), "-o", str(scratch / "libtfe_attn.so"), *map(str, SOURCES)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"the build failed ({r.returncode}): {' / '.join(r.stderr.strip().splitlines()[-3:])[:400]}")

    return build_once(library(tc), make)


class AttentionKernel:
    """The loaded function. `address` for the C++ round; `__call__` for the Python round."""

    def __init__(self, so: Path):
        self.lib = ctypes.CDLL(str(so))
        fn = getattr(self.lib, NAME)
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn.argtypes = [ptr, ptr, i64, i64, ptr, i64, i64, ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_float,
                       ctypes.c_int32]
        fn.restype = ctypes.c_int
        self.fn = fn
        self.address = ctypes.cast(fn, ptr).value
        # engine/cpu/elem.c, for the C++ round (the Python round runs the ATen ops they stand for)
        self.norm_address = ctypes.cast(self.lib.tfe_norm_rows, ptr).value
        self.heads_address = ctypes.cast(self.lib.tfe_heads, ptr).value
        self.greedy_address = ctypes.cast(self.lib.tfe_greedy, ptr).value
        self._mean_sq = self.lib.tfe_mean_sq_rows
        self._mean_sq.argtypes = [ptr, i64, i64, ctypes.c_int32, ptr]

    def elem(self, lengths: tuple[int, ...]) -> tuple[int, int, int, int]:
        """What the C++ round takes of engine/cpu/elem.c for rows of these lengths: the norms' and
        the heads' addresses, the means' width (sum_width) and the argmax's address."""
        return self.norm_address, self.heads_address, self.sum_width(lengths), self.greedy_address

    def sum_width(self, lengths: tuple[int, ...]) -> int:
        """The vector width (8 or 16) at which engine/cpu/elem.c's mean of squares gives ATen's
        `x.pow(2).mean(-1)` bit for bit on rows of each length (random rows of every magnitude,
        float32 and widened bf16), or 0: then the C++ round takes ATen's means. ATen's order is
        its own and may change with torch or the CPU, hence a check, not an assumption."""
        g = torch.Generator().manual_seed(0)
        for vw in (8, 16):
            ok = True
            for n in lengths:
                x = torch.randn(64, n, generator=g) * torch.logspace(-4, 4, 64)[:, None]
                for f in (x, x.bfloat16().float()):
                    out = torch.empty(64)
                    if self._mean_sq(f.data_ptr(), 64, n, vw, out.data_ptr()) != 0:
                        return 0
                    ok = ok and torch.equal(out, f.pow(2).mean(-1))
            if ok:
                return vw
        return 0

    def takes(self, n_heads: int, kv_heads: int, head_dim: int) -> bool:
        """The shapes the kernel does (as its source checks them)."""
        return head_dim in (16, 32, 64, 128) and n_heads % kv_heads == 0 and n_heads // kv_heads in (1, 2, 4, 8)

    def __call__(self, kc: torch.Tensor, vc: torch.Tensor, q: torch.Tensor, lanes: torch.Tensor,
                 positions: torch.Tensor, spare: int) -> torch.Tensor:
        """One layer's caches kc, vc [lanes, positions, KVH, d]; q [rows, H, d]; lanes and
        positions int64 [rows] -> [rows, H*d] in q's dtype (rows of lane `spare`: zeros)."""
        rows, h, d = q.shape
        if q.stride(2) != 1:
            q = q.contiguous()
        out = torch.empty(rows, h * d, dtype=q.dtype)
        rc = self.fn(kc.data_ptr(), vc.data_ptr(), kc.stride(0), kc.stride(1), q.data_ptr(), q.stride(0),
                     q.stride(1), out.data_ptr(), lanes.data_ptr(), positions.data_ptr(), rows, spare, h,
                     kc.shape[2], d, d ** -0.5, int(q.dtype == torch.bfloat16))
        if rc != 0:
            raise RuntimeError(f"the C decode attention refused q {tuple(q.shape)} (or ran out of memory)")
        return out


def kernel(tc: Toolchain) -> AttentionKernel | None:
    """The C kernel, or None for the batched-matmul path (no compiler, a failed build, the
    toolchain's C kernels off). A runner asks once, before its first forward, and keeps the answer:
    switching mid-serve would move bits."""
    if not tc.c_kernels:
        log.info("decode attention: bmm (the C kernels are off: TFENGINE_NO_CC)")
        return None
    try:
        k = AttentionKernel(build(tc))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        log.warning("decode attention: bmm (the C kernel is unavailable: %s)", e)
        return None
    log.info("decode attention: c kernel")
    return k
