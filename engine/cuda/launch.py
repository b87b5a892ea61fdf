"""How the CUDA forward's kernels launch: one LaunchMode passed from the runner down to each launch.

Eager calls take PLAIN (every knob off: plain launches, the unfolded attention); the runner's
decode-graph capture passes the mode its KernelConfig gives that row count (DecodeGraphs in
engine/runner/decode_graph.py). A kernel reads its knobs from the mode it is handed, never from a
module setting, so two runners (or a capture and an eager call) cannot see each other's choices.

Programmatic dependent launch (Hopper), `pdl`: a kernel may be launched while the one before it
runs; it waits (gdc_wait) before touching memory, so its launch and set-up overlap the previous
kernel's tail and no bit changes. 0: off; 1: wait only (the next kernel launches as this one's
programs finish); 2: wait, then let the next kernel launch at once (its programs wait on the GPU
for this one); 3: the small kernels (norms, attention) let the next launch first, then wait, so
the product after one (the TMA ring, engine/cuda/ring.py, whose weights stream before its own
wait) starts during the product before (the products themselves act as 2). Holding the weights in
registers or L2 before the wait, and 3 for the Triton products, measured no faster on the H200.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

# Triton's interpreter (the CPU tests): Triton's own setting (its TRITON_INTERPRET), asked of Triton.
INTERPRET = bool(triton.knobs.runtime.interpret)


@dataclass(frozen=True)
class LaunchMode:
    """The decode graph's launch knobs (KernelConfig turned into one capture's choices):
    pdl: the PDL mode above; fold_combine: the split attention's combine done by its last program
    (engine/cuda/merge.py fold_tail); fold_qk_norm: the q/k norm + RoPE + K/V write done by the split
    attention (engine/cuda/qkfold.py); ring: products through the TMA ring (engine/cuda/ring.py) where
    it takes them; prefetch: the small kernels ask their inputs into L2 before their PDL wait
    (engine/cuda/prefetch.py). interpret: launches go to Triton's interpreter, which has no PDL."""

    pdl: int = 0
    fold_combine: bool = False
    fold_qk_norm: bool = False
    ring: bool = False
    prefetch: bool = False
    interpret: bool = INTERPRET

    def pdl_on(self) -> int:
        """The PDL_ constexpr the kernels compile with (0 under the interpreter)."""
        return 0 if self.interpret else int(self.pdl)

    def opts(self) -> dict:
        """Extra launch arguments every kernel of the forward passes (launch_pdl when PDL is on)."""
        return {"launch_pdl": True} if self.pdl_on() else {}

    def prefetch_on(self) -> bool:
        """Whether the PDL kernels ask their inputs into L2 before the wait (never without PDL)."""
        return bool(self.prefetch and self.pdl_on())


PLAIN = LaunchMode()


@triton.jit
def pdl_enter(PDL_: tl.constexpr):
    """First thing in a kernel launched with PDL: wait for the kernel before to finish (its writes
    visible), then (PDL 2) let the next one launch; PDL 3 lets it launch first. Every program calls
    it, before any load or store (or pdl_launch, prefetches (engine/cuda/prefetch.py), then pdl_wait)."""
    pdl_launch(PDL_)
    pdl_wait(PDL_)


@triton.jit
def pdl_launch(PDL_: tl.constexpr):
    """pdl_enter's first half: at PDL 3 the next kernel may launch now."""
    if PDL_ > 2:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL_: tl.constexpr):
    """pdl_enter's second half: the wait (then, at PDL 2, the next kernel's launch)."""
    if PDL_ > 0:
        tl.extra.cuda.gdc_wait()
    if PDL_ == 2:
        tl.extra.cuda.gdc_launch_dependents()
