"""The CPU decode round in C++ (engine/cpu/round.cpp), built once with the machine's C++ compiler.

The Python round (CpuRunner._decode_cpu: the model's forward on engine/cpu/forward.py's ops) makes ~700 torch calls, each paying Python's
argument parsing and a GIL hand-off. The C++ round makes the same ATen calls on the same shapes
and layouts, in the same order, so the same kernels run and the logits are the same bits; it is
one call a round, with the GIL released: measured in-process on two AMD EPYC cores, 1.3-1.5x less
CPU a round, and the HTTP thread runs meanwhile.

Building takes 20-60 s of one core (ATen's headers), so it never delays start-up: the runner
builds in a background thread (`start`), through a `nice` subprocess, into a cache keyed by the
source, torch and Python (the toolchain's: engine.config.Toolchain), and takes the C++ round
from the first round after it loads; a later start finds the library built and loads it in
milliseconds. Without a compiler, or when the build fails, the Python round stays, and `status`
says why.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

from engine.config import Toolchain
from engine.cpu.decode_attention import build_once
from engine.cpu.packed import SPAN

log = logging.getLogger("engine.cpu.round")

NAME = "tfengine_cpu_round"
SOURCE = Path(__file__).with_name("round.cpp")
ONEDNN, MKL, PLAIN, WIDE = 0, 1, 2, 3  # the matmul kinds of round.cpp
BUILD = ("import sys, torch.utils.cpp_extension as e; "
         "e.load(sys.argv[1], [sys.argv[2]], build_directory=sys.argv[3], is_python_module=False, "
         "extra_cflags=['-O2'], verbose=False)")

def library(tc: Toolchain) -> Path:
    """Where the built library lives for this source, torch and Python."""
    key = hashlib.sha256(SOURCE.read_bytes() + f"{torch.__version__} {sys.version}".encode()).hexdigest()[:16]
    return tc.cache_dir() / f"cpu_round-{key}" / f"{NAME}.so"


def build(tc: Toolchain, timeout: float = 900.0) -> Path:
    """The library, compiled first if the cache lacks it (engine.cpu.decode_attention.build_once: one build
    at a time a cache entry, scratch folder renamed into place). Raises RuntimeError saying why not."""
    so = library(tc)
    if so.is_file():
        return so
    cxx = tc.cxx
    if not shutil.which(cxx):
        raise RuntimeError(f"no C++ compiler ({cxx}) on PATH")

    def make(scratch: Path) -> None:
        nice = ["nice", "-n", "10"] if shutil.which("nice") else []  # a background build yields to serving
        try:
            r = subprocess.run([*nice, sys.executable, "-c", BUILD, NAME, str(SOURCE), str(scratch)],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the build took over {timeout:.0f} s") from None
        if r.returncode != 0 or not (scratch / so.name).is_file():
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"the build failed ({r.returncode}): {' / '.join(tail)[:400]}")

    return build_once(so, make)


def loaded() -> bool:
    """Whether this process has the round's op (torch's registry is the process's: one library a process)."""
    return hasattr(torch.ops.tfengine_cpu, "decode_rows")


def load(so: Path) -> None:
    """Load the built library into this process, unless a runner before this one did."""
    if not loaded():
        torch.ops.load_library(str(so))


class CppRound:
    """The model's decode round through the C++ library (`rows`). `status`: "building", "built",
    "on" or why off; `ready` (asked by the decode thread) once loaded; `on` turns it off and on (benches)."""

    def __init__(self, model, packed, attn: int = 0, elem: tuple[int, int, int, int] = (0, 0, 0, 0),
                 toolchain: Toolchain = Toolchain()):
        self.toolchain = toolchain
        self.attn = attn  # engine/cpu/decode_attention.c's function address, or 0: the batched matmuls
        # engine/cpu/elem.c's tfe_norm_rows and tfe_heads, the width its means of squares take
        # ATen's bits at (AttentionKernel.sum_width), and tfe_greedy; or 0s: ATen's ops (the same
        # bits either way)
        self.elem = elem
        layers = model.model.layers
        keys = [(i, w) for i in range(len(layers)) for w in ("qkv", "o", "gate_up", "down")] + ["lm_head"]
        self.kind = WIDE if packed.wide is not None else ONEDNN if packed.bf16 else MKL if packed.mkl else PLAIN
        self.wide = packed.wide.address if packed.wide is not None else 0  # engine/cpu/wide.c's tfe_wide_linear
        self.plain = [packed.plain[k] for k in keys]
        self.mats = [packed.packed[k] for k in keys] if self.kind != PLAIN else self.plain
        self.norms = [w for i, layer in enumerate(layers)
                      for w in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                                packed.qk_norm[i])] + [model.model.norm.weight]
        self.model = model
        self.shape = packed.shape
        self.eps = float(model.config.rms_norm_eps)
        self.status = "off: not started"
        self.on = False
        self._built: Path | None = None  # set by the background build; loaded by the decode thread

    @classmethod
    def started(cls, model, packed, when: bool | None, attn: int = 0,
                elem: tuple[int, int, int, int] = (0, 0, 0, 0), toolchain: Toolchain = Toolchain()) -> "CppRound | None":
        """KernelConfig.cpu_cpp: None builds in the background, True before returning, False: no C++ round.
        attn: the C decode attention's address (the process's choice), or 0; elem: the C
        elementwise passes' (engine/cpu/elem.c), or 0s."""
        if when is False:
            return None
        r = cls(model, packed, attn, elem, toolchain)
        r.start(wait=bool(when))
        return r

    @staticmethod
    def describe(r: "CppRound | None") -> str:
        """/v1/engine's `cpu_round`: which round runs, and why not C++ (never loads: any thread asks)."""
        return "python" if r is None else "C++" if r.on else f"python (C++ {r.status})"

    def start(self, wait: bool = False) -> None:
        """Built already (or wait): load now, in milliseconds. Else build in a background thread,
        and the decoding thread loads the library at its next round (`ready`), between rounds."""
        self.status = "building"
        if wait or loaded() or library(self.toolchain).is_file():
            self._build()
            self.ready
        else:
            threading.Thread(target=self._build, name="cpu-round-build", daemon=True).start()

    def _build(self) -> None:
        try:
            self._built = build(self.toolchain)
            self.status = "built, loads at the next round"
        except Exception as e:  # a missing compiler, a failed build: the Python round stays
            self._off(e)

    def _off(self, e: Exception) -> None:
        self.status = f"off: {e}"
        log.warning("C++ decode round unavailable, the Python round runs: %s", e)

    @property
    def ready(self) -> bool:
        if not self.on and self._built is not None and self.status.startswith("built"):
            try:
                load(self._built)
                self.on, self.status = True, "on"
                log.info("C++ decode round loaded: rounds run in C++ from this one on (the same bits)")
            except Exception as e:  # a library that will not load: the Python round stays
                self._off(e)
        return self.on

    def rows(self, rows: list[list[int]], spare: int, kv) -> tuple[torch.Tensor, torch.Tensor]:
        """ModelRunner.padded_round's [tokens, positions, lanes] -> (logits [rows, vocab], greedy ids [rows]):
        the Python round's logits (CpuRunner._decode_cpu) with decode_attention_buckets' plan, bit for bit."""
        m = self.model
        h, kvh, d = self.shape
        return torch.ops.tfengine_cpu.decode_rows(
            rows[0], rows[1], rows[2], spare, SPAN, m.model.embed_tokens.weight, m.cos, m.sin, kv.k, kv.v,
            self.mats, self.plain, self.norms, self.kind, h, kvh, d, self.eps, self.attn, *self.elem, self.wide)
