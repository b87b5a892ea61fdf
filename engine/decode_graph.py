"""The decode round as CUDA graphs, captured for a ModelRunner at its fixed padded shape.

- The host-fed graph: its first node copies the round's rows (tokens, positions, lanes, steps)
  from pinned memory, then the forward and the argmax; `fresh` writes the rows and replays it.
- Where rounds run ahead (`overlaps`, engine/ahead.py), two copies of the chained graph: the round
  after the last, its inputs advanced on the device from the last round's ids.
- Captured inside the launch mode of the runner's knobs (engine/kernels_skinny.py launch_mode: PDL,
  the attention's folds, the TMA ring); a failed capture leaves eager rounds and says why.
"""
from __future__ import annotations

import logging

import torch

from engine.ahead import Ahead, advance_inputs, steps

log = logging.getLogger("engine.runner")


def capture(r) -> bool:
    """ModelRunner.capture_graph: the graphs into `r` (graph, ahead, the static buffers); False,
    with `r.graph_fallback_reason`, on the CPU or where capture fails."""
    if r.device.type != "cuda":
        r.graph_fallback_reason = f"no CUDA graphs on device {r.device.type}: eager decode rounds"
        log.info(r.graph_fallback_reason)
        return False
    try:
        # tokens, positions, lanes, steps (1 on a lane's row: engine/ahead.py advance_inputs)
        r._h_in = torch.zeros(4, r.parallel, dtype=torch.long).pin_memory()
        r._h_np = r._h_in.numpy()  # rows written straight in, no tensor from lists
        r._s_in = torch.zeros(4, r.parallel, dtype=torch.long, device=r.device)
        r._s_in[2] = r._h_in[2] = r.spare  # warm-up (and a replay before any round) write the spare lane
        from engine.kernels_skinny import launch_mode
        knobs, (combine, r._qk_fold) = r.cfg.kernels, folds(r)
        cap = torch.cuda.get_device_capability(r.device)
        r.decode_pdl = knobs.pdl_for(r.cfg.tensor_parallel, cap) * r.fused  # /v1/engine's decode_pdl
        mode = launch_mode(r.decode_pdl, fold_combine=combine, fold_qk_norm=r._qk_fold,
                           ring=r.skinny and knobs.ring)
        with torch.inference_mode(), mode:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    r._decode_body(r._s_in)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # the H2D copy inside: one launch a round, not two
                r._s_in.copy_(r._h_in, non_blocking=True)
                r._s_logits = r._decode_body(r._s_in)
                r._s_out = r._s_logits.argmax(-1)
            if overlaps(r):  # the round after the last, from its ids on the device; two copies
                chained = [torch.cuda.CUDAGraph() for _ in range(2)]  # taken in turn (engine/ahead.py)
                for c in chained:
                    with torch.cuda.graph(c):
                        advance_inputs(r._s_in, r._s_out)
                        torch.argmax(r._decode_body(r._s_in), -1, out=r._s_out)
                r.ahead = Ahead(lambda rows: fresh(r, rows), [c.replay for c in chained], r._s_out, r.spare,
                                r.max_model_len)
        torch.cuda.synchronize()
        r.graph = g
        return True
    except Exception as e:  # pragma: no cover - depends on the device
        r.graph, r.ahead = None, None
        r.graph_fallback_reason = f"CUDA graph capture failed ({e!r}): eager decode rounds"
        log.warning(r.graph_fallback_reason)
        return False


def folds(r) -> tuple[bool, bool]:
    """The decode graph's folds (engine/kernels.py): the attention's combine, and its q/k norm +
    RoPE + K/V write. At one rank only (checked on the device there). The q/k fold writes a row's
    K/V in the kernel that attends, so not with a drafter: its rows of one lane read the rows
    before them, written in the same round."""
    from engine.kernels import qk_fold_takes
    knobs, a = r.cfg.kernels, r.model.model.layers[0].self_attn
    solo = r.fused and r.cfg.tensor_parallel == 1
    qk = (solo and knobs.fold_qk_norm and not (r.cfg.drafter and r.cfg.drafts)
          and qk_fold_takes(a.n_heads, a.n_kv, a.head_dim))
    return solo and knobs.fold_combine, bool(qk)


def overlaps(r) -> bool:
    """Whether rounds run ahead (KernelConfig.overlap): by default with the decode graph at one rank."""
    on = r.cfg.kernels.overlap
    return bool(on) if on is not None else r.device.type == "cuda" and r.cfg.tensor_parallel == 1


def fresh(r, rows) -> None:
    """Launch the host-fed graph on `rows` [tokens, positions, lanes]: written into its pinned inputs
    (with the steps row), which its first node copies in."""
    r._h_np[:3] = rows
    r._h_np[3] = steps(rows[2], r.spare)
    r.graph.replay()
