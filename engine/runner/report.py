"""What a runner reports of itself (/v1/engine, receipts, benches): its model, device,
kernels and shapes. Read at start-up and by benches; nothing here is on a hot path."""
from __future__ import annotations

import dataclasses

import torch

from engine.runner import device_info
from engine.cpu.packed import cpu_bf16_native
from engine.cpu.round import CppRound


def describe(r) -> dict:
    """The runner's model, device, kernels and shapes, for /v1/engine and the receipts."""
    m = r.model_config
    dev = device_info.identity(r.device)
    return {
        **dev,
        "fused_kernels": r.fused,
        "decode_matmuls": "triton skinny" if r.skinny else ("cublas" if r.device.type == "cuda" else "torch"),
        "torch": torch.__version__,
        "dtype": r.cfg.dtype,
        "model": r.model_name,
        "load_format": r.cfg.load_format,
        "shape": {"hidden": m.hidden_size, "layers": m.num_hidden_layers, "heads": m.num_attention_heads,
                  "kv_heads": m.num_key_value_heads, "head_dim": m.head_dim,
                  "intermediate": m.intermediate_size, "vocab": m.vocab_size},
        "parameters": m.num_parameters(),
        "parallel": r.parallel,
        "tensor_parallel": 1,  # engine/parallel/runner.py: N, and every rank's device in `devices`
        "devices": [dev["device_name"]],
        "max_model_len": r.max_model_len,
        "prefill_rows": r.prefill_rows,
        "cuda_graph": r.graph is not None,
        "decode_ahead": r.ahead is not None,  # rounds run one ahead (engine/runner/ahead.py)
        "decode_rows": list(r.buckets),  # the row counts decode rounds run at (engine/runner/decode_graph.py)
        "capabilities": capabilities_doc(r.caps),  # what the lane host may ask of it (backend.Capabilities)
        **(_describe_cuda(r) if r.device.type == "cuda" else {}),
        "prefill_attention": _prefill_attention_name(r),
        "threads": torch.get_num_threads(),
        **(_describe_cpu(r) if r.device.type == "cpu" else {}),
    }


def capabilities_doc(caps) -> dict:
    """Declared capabilities (backend.Capabilities) as JSON keeps them: a profile's runners and
    /v1/engine, so a simulation offers the host what the real runner did."""
    d = dataclasses.asdict(caps)
    for k in ("cut_sizes", "round_sizes"):
        d[k] = list(d[k]) if d[k] is not None else None
    return d


def _describe_cuda(r) -> dict:
    """The decode graph's launch mode and which products its TMA ring takes (engine/cuda/ring.py)."""
    from engine.cuda.skinny import ring_split  # (CUDA only: a CPU runner's report loads no triton)
    ring = []
    if r.skinny and r.cfg.kernels.ring and r.graph is not None and r.kernels.ring.available():
        layer = r.model.model.layers[0]
        for name, w, gated in (("q/k/v", layer.self_attn.wqkv, False), ("o", layer.self_attn.o_proj.weight, False),
                               ("down", layer.mlp.down_proj.weight, False), ("gate/up", layer.mlp.w_gate_up, True)):
            if ring_split(*w.shape, r.round_rows, r.kernels.skinny, gated) is not None:
                ring.append(name)
    return {"decode_pdl": getattr(r, "decode_pdl", 0) if r.graph is not None else 0, "decode_ring": ring,
            "cut_attention": "tiles" if r.fused and r.kernels.cut_flash is not None else "cudnn",
            "cuda_mixed": cuda_mixed(r), "cuda_split": cuda_split(r)}


def cuda_split(r) -> str:
    """How a CUDA runner's SMs are split (--prefill-mode split: engine/cuda/partitions.py)."""
    sp = getattr(r, "sm_split", None)
    if sp is None:
        return "off"
    return f"decode rounds on {sp.decode_sms} SMs beside prompt cuts on {sp.prompt_sms}, while streams decode"


def cuda_mixed(r) -> str:
    """How a CUDA runner's mixed forwards run (CudaRunner._mixed_fused)."""
    if r.cfg.prefill_mode != "mixed":
        return "off"
    g = getattr(r, "mixed_graphs", None)
    if g is not None and g.shapes:
        how = g.describe()
    else:
        why = g.fallback_reason if g is not None else "no graphs at tensor parallel > 1"
        how = f"eager ({why}): the cut's products through cuBLAS at checked counts, the round's through its own kernels"
    return f"{how}; cut_flash and the decode attention; cuts end on multiples of {r.cut_granule}"


def _describe_cpu(r) -> dict:
    c = r.cpu
    return {"cpu_bf16_native": cpu_bf16_native(), "cpu_matmuls": "torch" if c.packed is None else c.packed.kind,
            "cpu_weights": "bfloat16 values, float32 compute" if c.wide_weights else r.cfg.dtype,
            "decode_attention": c.describe_attention(),
            "cpu_round": CppRound.describe(c.round),
            "cpu_prompt_cuts": cpu_prompt_cuts(r), "cpu_mixed": cpu_mixed(r)}


def cpu_mixed(r) -> str:
    """How a CPU runner's mixed forwards multiply (CpuKernels.mix_floor; the runner's cut_free, cut_granule)."""
    if r.cfg.prefill_mode != "mixed":
        return "off"
    if r.cpu.mix_floor is None:
        return "each product per part, cuts on the grid"
    shared = "one product over the cuts' rows, the round's rows in the wide kernel" if r.cpu.packed.wide is not None else \
        "one product over every row"
    return f"{shared} (row-invariant from {r.cpu.mix_floor} rows), cuts end on multiples of {r.cut_granule}"


def cpu_prompt_cuts(r) -> str:
    """How a CPU runner fills prompt cuts (CpuKernels.rows_free)."""
    return "short ones filled together, tiles of their rows only" if r.cpu.rows_free else "one at a time, tiles padded"


def _prefill_attention_name(r) -> str:
    if r.device.type != "cuda":
        from engine.cpu.cut_attention import describe as cut_attention
        return "sdpa" if r.cpu is None or r.cpu.packed is None else cut_attention(r.dtype, r.prefill_rows)
    if r.fused and r.kernels.cut_flash is not None:
        c = r.kernels.cut_flash
        return (f"tiles at absolute positions (cut_flash: {c.block_m} queries x {c.block_n} keys, splits of {c.split}"
                f"{', K and V by TMA' if c.tma else ''})")
    from engine.cuda.prefill import CUDNN_MIN_ROWS
    return (f"prefix + diagonal halves merged; {r.kernels.cuts.name} for cuts of >= {CUDNN_MIN_ROWS} rows, "
            "flash below")
