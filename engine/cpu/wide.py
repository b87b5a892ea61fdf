"""The decode round's products over bf16-stored weights on CPUs without bf16 arithmetic
(engine/cpu/wide.c, built into the C attention's library): float32 inputs and sums, the
weights widened in registers, half the bytes a round of float32 weights streams.

`WideKernel` wraps the compiled function for the Python round (through ctypes, which drops the
GIL); the C++ round (engine/cpu/round.cpp) calls the same function through its address, so both
rounds give the same bits. Each listed row's sums run in an order of its own (wide.c), so a row
multiplies to the same bits alone, beside others, at any row count."""
from __future__ import annotations

import ctypes

import torch

from engine.cpu.packed import cpu_bf16_native


def wide_fits(cpu_bf16_native: bool, capability: str) -> bool:
    """Whether the decode round takes the widened-bf16 products here: float32 compute (no AMX or
    avx512_bf16, which keep oneDNN's bf16 products) on a CPU with at least AVX2, whose FMA the
    kernel uses (torch's capability string: "DEFAULT", "AVX2", "AVX512", ...)."""
    return not cpu_bf16_native and capability.upper() in ("AVX2", "AVX512", "ZVECTOR", "SVE256")


def wide_wanted(device: str, dtype: str, knob: bool | None) -> bool:
    """Whether this runner's matrices hold bf16 values (KernelConfig.cpu_wide; None: by the ISA).
    A property of the model, not of the kernels: a runner without the C library (no compiler)
    multiplies the same rounded weights through MKL, so its tokens are the same model's."""
    if device != "cpu" or dtype != "float32" or knob is False:
        return False
    return knob is True or wide_fits(cpu_bf16_native(), torch.backends.cpu.get_cpu_capability())


def round_weights(model) -> None:
    """Every matrix a product reads (q/k/v, o, gate/up, down a layer, the lm_head) rounded to bf16
    in place, kept in float32 (exactly), so prompt cuts (MKL) and decode rounds (the wide kernel)
    multiply the same values; the HF parameters are views of the fused matrices (Qwen3.fuse)."""
    with torch.no_grad():
        mats = [model.lm_head.weight]
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            mats += [a.wqkv, a.o_proj.weight, m.w_gate_up, m.down_proj.weight]
        for w in {id(w): w for w in mats}.values():
            w.copy_(w.to(torch.bfloat16))


class WideKernel:
    """tfe_wide_linear from the loaded library `lib` (engine.cpu.decode_attention.AttentionKernel.lib)."""

    def __init__(self, lib: ctypes.CDLL):
        fn = lib.tfe_wide_linear
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn.argtypes = [ptr, i64, ptr, i64, ptr, i64, i64, ptr, i64, i64, i64]
        fn.restype = ctypes.c_int
        self.fn = fn
        self.address = ctypes.cast(fn, ptr).value
        isa = lib.tfe_wide_isa
        isa.restype = ctypes.c_char_p
        self.isa = isa().decode()  # what the library was compiled for: "avx512", "avx2+fma", "scalar fmaf"

    @staticmethod
    def pack(w: torch.Tensor) -> torch.Tensor:
        """A weight [n, k] as contiguous bf16 (the values it keeps: round to nearest even)."""
        return w.detach().to(torch.bfloat16).contiguous()

    def __call__(self, x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """x [m, k] float32 @ w [n, k] bf16 -> [m, n] float32; `rows` (int64): the rows to compute,
        the others zero (a round's padding rows). Every row's bits are its own."""
        m, k = x.shape
        n = w.shape[0]
        if x.dtype != torch.float32 or w.dtype != torch.bfloat16 or w.shape[1] != k:
            raise ValueError(f"wide products take float32 x and bf16 w of the same width: {x.dtype} {tuple(x.shape)}, "
                             f"{w.dtype} {tuple(w.shape)}")
        if x.stride(1) != 1:
            x = x.contiguous()
        if rows is None:
            rows = torch.arange(m)
        y = torch.zeros(m, n) if len(rows) < m else torch.empty(m, n)
        if self.fn(x.data_ptr(), x.stride(0), rows.data_ptr(), len(rows), w.data_ptr(), n, k, y.data_ptr(), n, 0, n):
            raise ValueError(f"wide products refuse width {k} (a multiple of 16 only)")
        return y
