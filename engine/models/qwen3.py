"""A Qwen3 decoder, readable top to bottom (gpt-fast style).

embedding -> per layer: RMSNorm -> attention (q/k/v/o without bias, per-head RMSNorm on q and k,
RoPE, grouped-query) -> residual -> RMSNorm -> SwiGLU MLP -> residual -> final norm -> lm_head.

Parameter names are Hugging Face's Qwen3 names, so an HF safetensors directory loads with strict
name matching. Arithmetic follows HF's (RMSNorm in float32, RoPE tables in float32 cast to the
model dtype, rotate-half), so float32 logits agree with `transformers` within rounding.

Two forwards, both writing the lane's KV rows in place (engine.runner.kv_cache.KVCache):
- `prefill(tokens, lane, start, kv)`: one cut, rows [start, end) of one lane, causal over [0, end).
- `decode(tokens, positions, lanes, kv, attend)`: one row per lane at a fixed padded shape; the
  attention of each row reads only its own lane's rows [0, pos] (`attend` does that).

After loading, `fuse()` concatenates q/k/v and gate/up into one matrix each and re-points the HF
parameters as views into it: one matmul instead of three, no extra memory, names unchanged.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(cfg: ModelConfig, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32, [length, head_dim], as HF builds them (cat of the two halves)."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    freqs = torch.arange(length, device=device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [rows, heads, head_dim]; cos/sin: [rows, head_dim] already in x's dtype."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.wqkv: torch.Tensor | None = None  # set by fuse()

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x: [rows, hidden] -> q [rows, H, d], k and v [rows, KVH, d], q and k normed and rotated."""
        if self.wqkv is not None:
            return self.heads(F.linear(x, self.wqkv), cos, sin)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.heads(torch.cat([q, k, v], dim=-1), cos, sin)

    def heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """qkv [rows, (H + 2 KVH) * d] (the fused projection's output) -> q, k, v as qkv() gives."""
        rows, d = qkv.shape[0], self.head_dim
        q, k, v = qkv.split([self.n_heads * d, self.n_kv * d, self.n_kv * d], dim=-1)
        q = self.q_norm(q.reshape(rows, self.n_heads, d))
        k = self.k_norm(k.reshape(rows, self.n_kv, d))
        v = v.reshape(rows, self.n_kv, d)
        return rotate(q, cos, sin), rotate(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.w_gate_up: torch.Tensor | None = None  # set by fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w_gate_up is not None:
            gate, up = F.linear(x, self.w_gate_up).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# attend(layer_index, q [rows, H, d]) -> [rows, H*d]; the K/V rows are already in the cache.
Attend = Callable[[int, torch.Tensor], torch.Tensor]


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.cos: torch.Tensor | None = None  # [max_len, head_dim], model dtype (setup_rope)
        self.sin: torch.Tensor | None = None
        # Tensor parallel (engine/parallel/group.py): the sum across ranks after the row-parallel o and
        # down products; None (one rank): nothing to sum.
        self.tp_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        # and, in the fused trunk, the sum fused with the add + norm after it (TensorParallel's
        # fused_write / fused_add_norm); None: sum, then add_rmsnorm
        self.tp_fused = None

    def _summed(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.tp_reduce is None else self.tp_reduce(y)

    def _add_summed_norm(self, x, mm, a, w, norm_w, eps, launch):
        """add_rmsnorm(x, the sum over ranks of mm(a, w), norm_w): fused (engine/parallel/fused.py) where
        it takes the product, the same bits either way."""
        f = self.tp_fused
        if f is not None and f.fused_write(mm, a, w):
            return f.fused_add_norm(x, norm_w, eps, launch.mode)
        return launch.add_rmsnorm(x, self._summed(mm(a, w)), norm_w, eps)

    # ---- set-up after the weights are in place -------------------------------------------
    def setup_rope(self, length: int) -> None:
        dev, dtype = self.model.embed_tokens.weight.device, self.model.embed_tokens.weight.dtype
        cos, sin = rope_tables(self.config, length, dev)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)

    def tie(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def fuse(self) -> None:
        """One q/k/v matrix and one gate/up matrix per layer; the HF parameters become views."""
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            a.wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            nq, nk = a.q_proj.weight.shape[0], a.k_proj.weight.shape[0]
            a.q_proj.weight.data = a.wqkv[:nq]
            a.k_proj.weight.data = a.wqkv[nq:nq + nk]
            a.v_proj.weight.data = a.wqkv[nq + nk:]
            m.w_gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight])
            ni = m.gate_proj.weight.shape[0]
            m.gate_proj.weight.data = m.w_gate_up[:ni]
            m.up_proj.weight.data = m.w_gate_up[ni:]

    # ---- the trunk -----------------------------------------------------------------------
    def trunk(self, tokens: torch.Tensor, positions: torch.Tensor, write_kv, attend: Attend) -> torch.Tensor:
        """tokens, positions: [rows]. write_kv(layer, k, v) stores the rows' K/V; attend reads."""
        cos, sin = self.cos[positions], self.sin[positions]
        x = self.model.embed_tokens(tokens)
        for i, layer in enumerate(self.model.layers):
            a = layer.self_attn
            q, k, v = a.qkv(layer.input_layernorm(x), cos, sin)
            write_kv(i, k, v)
            x = x + self._summed(a.o_proj(attend(i, q)))
            x = x + self._summed(layer.mlp(layer.post_attention_layernorm(x)))
        return self.model.norm(x)

    def trunk_cpu(self, tokens: torch.Tensor, positions: torch.Tensor, write_kv, attend: Attend, packed,
                  tiled: bool = False, live: torch.Tensor | None = None, mm=None) -> torch.Tensor:
        """The trunk with the CPU's kernels (engine.cpu.packed.PackedLinears): packed.mm(x, key)
        multiplies by a prepacked matrix, packed.heads(i, qkv, cos, sin) norms and rotates q and
        k in one pass; the same arithmetic as `trunk` otherwise. tiled: a decode round's products
        in tiles of a fixed row count (packed.mm_tiled), `live` the rows a row-invariant kernel
        multiplies (the others zero, as the C++ round's); mm(x, key): the products another way."""
        cos, sin = self.cos[positions], self.sin[positions]
        x = self.model.embed_tokens(tokens)
        if mm is None:
            mm = (lambda x, key: packed.mm_tiled(x, key, live)) if tiled else packed.mm  # noqa: E731
        for i, layer in enumerate(self.model.layers):
            q, k, v = packed.heads(i, mm(layer.input_layernorm(x), (i, "qkv")), cos, sin)
            write_kv(i, k, v)
            x = x + self._summed(mm(attend(i, q), (i, "o")))
            gate, up = mm(layer.post_attention_layernorm(x), (i, "gate_up")).chunk(2, dim=-1)
            x = x + self._summed(mm(F.silu(gate) * up, (i, "down")))
        return self.model.norm(x)

    def prefill_many_cpu(self, seqs: list[tuple[torch.Tensor, int, int]], kv, packed, cut_attention,
                         pad: bool = True) -> torch.Tensor:
        """`prefill` through trunk_cpu for cuts [(tokens [T], lane, start)], rows one after another:
        each cut's last-row logits. A cut attends over its own lane in query tiles (cpu_attention.tile_for(
        --prefill-rows)) at absolute positions; pad=False: a partly covered tile multiplies the cut's rows
        only. With row-invariant products (engine.cpu.packed.rows_invariant) a cut's bits are its bits alone."""
        ends = torch.tensor([t.shape[0] for t, _, _ in seqs]).cumsum(0).tolist()
        spans = [(e - t.shape[0], e, lane, start) for e, (t, lane, start) in zip(ends, seqs)]
        tokens = seqs[0][0] if len(seqs) == 1 else torch.cat([t for t, _, _ in seqs])
        positions = torch.cat([torch.arange(s, s + b - a, device=tokens.device) for a, b, _, s in spans])

        def write_kv(i, k, v):
            for a, b, lane, s in spans:
                kv.k[i, lane, s:s + b - a] = k[a:b]
                kv.v[i, lane, s:s + b - a] = v[a:b]

        def attend(i, q):
            outs = [cut_attention(q[a:b], kv.k[i, lane], kv.v[i, lane], s, pad) for a, b, lane, s in spans]
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        x = self.trunk_cpu(tokens, positions, write_kv, attend, packed)
        return packed.mm(x[[b - 1 for _, b, _, _ in spans]], "lm_head")

    def mixed_cpu(self, seqs: list[tuple[torch.Tensor, int, int]], dec: torch.Tensor, kv, packed,
                  attend_dec: Callable[[int, torch.Tensor], torch.Tensor], cut_attention, pad: bool,
                  floor: int | None, grid: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt cuts [(tokens [T], lane, start)] and a padded decode round dec [tokens, positions,
        lanes] in one forward through trunk_cpu: the cuts' rows first, then the round's. Each row
        writes its K/V where `prefill_many_cpu` and `decode_cpu` write it; a cut attends as there
        (tiles at absolute positions), the round's rows through attend_dec(layer, q).

        The products give every row the bits it has in its own call. With `floor` (the fewest rows
        from which this CPU's products are row-invariant: engine.cpu.packed.invariant_floor) one
        product over every row (the cuts' rows only, where the round's products are the wide
        kernel's), zero rows added up to the floor, except a whole grid cut (`grid`)
        shorter than the floor, which `prefill_step` multiplied at its own row count and so is here
        (a piece of a longer grid cut was multiplied among R rows: it shares). With floor None,
        each cut alone and the round's rows in its tiles (the cuts must then be grid cuts). Returns
        (each cut's last-row logits [cuts, vocab], each row alone as prefill_step takes it; the
        round's logits [P, vocab], in its tiles)."""
        ends = torch.tensor([t.shape[0] for t, _, _ in seqs]).cumsum(0).tolist()
        spans = [(e - t.shape[0], e, lane, start) for e, (t, lane, start) in zip(ends, seqs)]
        n = ends[-1]
        d_tokens, d_positions, d_lanes = dec[0], dec[1], dec[2]
        tokens = torch.cat([t for t, _, _ in seqs] + [d_tokens])
        positions = torch.cat([torch.arange(s, s + b - a, device=tokens.device) for a, b, _, s in spans] + [d_positions])
        m = tokens.shape[0]
        if floor is None:
            parts = [(a, b, packed.mm) for a, b, _, _ in spans] + [(n, m, packed.mm_tiled)]
        else:  # runs of rows that share a product; a whole grid cut below the floor alone
            # the wide kernel gives the round's rows their bits at any row count, MKL's cut product
            # other bits: there the round's rows keep their own product beside the cuts' shared one
            apart = packed.wide is not None
            runs = []
            for a, b, alone in ([(a, b, g and b - a < floor) for (a, b, _, _), g in zip(spans, grid)]
                                + ([] if apart else [(n, m, False)])):
                if not alone and runs and not runs[-1][2] and runs[-1][1] == a:
                    runs[-1] = (runs[-1][0], b, False)
                else:
                    runs.append((a, b, alone))

            def shared(x, key):
                short = floor - x.shape[0]
                if short <= 0:
                    return packed.mm(x, key)
                return packed.mm(torch.cat([x, x.new_zeros(short, x.shape[1])]), key)[:x.shape[0]]
            parts = [(a, b, packed.mm if alone else shared) for a, b, alone in runs]
            if apart:
                parts.append((n, m, packed.mm_tiled))

        def mm(x, key):
            if len(parts) == 1:
                return parts[0][2](x, key)
            return torch.cat([f(x[a:b], key) for a, b, f in parts])

        def write_kv(i, k, v):
            for a, b, lane, s in spans:
                kv.k[i, lane, s:s + b - a] = k[a:b]
                kv.v[i, lane, s:s + b - a] = v[a:b]
            kv.k[i, d_lanes, d_positions] = k[n:]
            kv.v[i, d_lanes, d_positions] = v[n:]

        def attend(i, q):
            outs = [cut_attention(q[a:b], kv.k[i, lane], kv.v[i, lane], s, pad) for a, b, lane, s in spans]
            return torch.cat(outs + [attend_dec(i, q[n:].contiguous())])

        x = self.trunk_cpu(tokens, positions, write_kv, attend, packed, mm=mm)
        firsts = torch.cat([packed.mm(x[[b - 1]], "lm_head") for _, b, _, _ in spans])
        return firsts, packed.mm_tiled(x[n:], "lm_head")

    def decode_cpu(self, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor, kv,
                   attend_fn: Callable[[int, torch.Tensor], torch.Tensor], packed) -> torch.Tensor:
        """`decode` through trunk_cpu; attend_fn(layer, q) reads each row's own lane."""

        def write_kv(i, k, v):
            kv.k[i, lanes, positions] = k
            kv.v[i, lanes, positions] = v

        live = (lanes != kv.spare).nonzero().flatten()  # the padding rows write the spare lane
        x = self.trunk_cpu(tokens, positions, write_kv, attend_fn, packed, tiled=True, live=live)
        return packed.mm_tiled(x, "lm_head", live)

    def _launch(self, launch):
        """The fused forward's kernels (engine.cuda.kernels.Launch): the runner's, or plain ones for
        this model's device. Imported here: the CPU forwards must not need triton."""
        if launch is not None:
            return launch
        from engine.cuda.kernels import CudaKernels
        return CudaKernels(self.model.embed_tokens.weight.device).at()

    def trunk_fused(self, tokens, positions, lanes, kv, attend: Attend, skinny: bool = False, mm=None,
                    attend_qkv=None, launch=None, act=None) -> torch.Tensor:
        """The same trunk through the fused Triton kernels (CUDA): add+norm, q/k norm + RoPE +
        cache write, silu*up. The matmuls are cuBLAS's, or with `skinny` (a decode round's few
        rows) engine.cuda.skinny's where it measured faster, or `mm`'s. attend_qkv(i, qkv, attn):
        the q/k norm, RoPE and cache write done by the attention itself (engine/cuda/qkfold.py).
        launch: the kernels and their launch mode (engine.cuda.kernels.Launch; None: plain).
        act(h, w): silu(gate) * up of the gate/up product, where `mm`'s would not do (None: silu_mul of mm's)."""
        launch = self._launch(launch)
        if mm is None and skinny:
            mm, act = launch.linear, launch.gate_up_silu
        elif mm is None:
            mm, act = F.linear, (lambda h, w: launch.silu_mul(F.linear(h, w)))
        elif act is None:
            act = lambda h, w: launch.silu_mul(mm(h, w))  # noqa: E731
        cfg, layers = self.config, self.model.layers
        eps = cfg.rms_norm_eps
        x, h = launch.embed_rmsnorm(self.model.embed_tokens.weight, tokens, layers[0].input_layernorm.weight, eps)
        for i, layer in enumerate(layers):
            a, m = layer.self_attn, layer.mlp
            qkv = mm(h, a.wqkv)
            if attend_qkv is not None:
                o = attend_qkv(i, qkv, a)
            else:
                o = attend(i, launch.qk_norm_rope_write(qkv, a.q_norm.weight, a.k_norm.weight, self.cos, self.sin,
                                                        kv.k[i], kv.v[i], lanes, positions, a.n_heads, a.n_kv,
                                                        a.head_dim, eps))
            x, h = self._add_summed_norm(x, mm, o, a.o_proj.weight, layer.post_attention_layernorm.weight, eps, launch)
            nxt = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else self.model.norm.weight
            x, h = self._add_summed_norm(x, mm, act(h, m.w_gate_up), m.down_proj.weight, nxt, eps, launch)
        return h

    def _qk_folded(self, attend_fn, kv, lanes, positions, launch):
        """The decode round's attend_qkv for trunk_fused where the launch mode folds the q/k norm
        (LaunchMode.fold_qk_norm), the attention is the launch's decode attention and it takes the
        shape (engine.cuda.decode_attention.qk_fold_takes); else None."""
        a0 = self.model.layers[0].self_attn
        if not (launch.mode.fold_qk_norm and attend_fn == launch.attention
                and launch.qk_fold_takes(a0.n_heads, a0.n_kv, a0.head_dim)):
            return None
        eps = self.config.rms_norm_eps

        def attend_qkv(i, qkv, a):
            qk = (a.q_norm.weight, a.k_norm.weight, self.cos, self.sin, a.n_heads, eps)
            return launch.attention(kv, i, qkv, lanes, positions, qk=qk)
        return attend_qkv

    def prefill(self, tokens: torch.Tensor, lane: int, start: int, kv, all_logits: bool = False,
                fused: bool = False, launch=None) -> torch.Tensor:
        """One cut: tokens [T] at positions [start, start+T) of `lane`. Returns the logits of the
        last row ([vocab], the lm_head runs for that row only), or of every row if all_logits.
        fused: run the trunk through the Triton kernels (CUDA, or the interpreter), `launch`'s."""
        attention = prefill_attention
        if fused:  # the CUDA path's cut attention, also under the interpreter (tests)
            launch = self._launch(launch)
            attention = launch.cut_attention
        positions, write_kv, attend = cut_io(tokens, lane, start, kv, attention)
        if fused:
            lanes = torch.full_like(positions, lane)
            x = self.trunk_fused(tokens, positions, lanes, kv, attend, launch=launch)
        else:
            x = self.trunk(tokens, positions, write_kv, attend)
        return self.lm_head(x if all_logits else x[-1])

    def prefill_many(self, seqs: list[tuple[torch.Tensor, int, int]], kv, mm, padded_rows=None,
                     launch=None) -> torch.Tensor:
        """Several cuts in one forward through the fused kernels: seqs = [(tokens [T], lane, start)],
        their rows one after another. Each cut's attention reads only its own lane (cut_attention)
        and `mm` must give a row's bits whatever the other rows (engine.cuda.batch.matmul), so
        a cut's results do not depend on the cuts beside it. padded_rows(m): the rows a forward
        of m rows runs at (engine.cuda.batch.Buckets.padded_rows; None: m). Returns each cut's
        last-row logits."""
        launch = self._launch(launch)
        cut_attention = launch.cut_attention
        dev = seqs[0][0].device
        ends = torch.tensor([t.shape[0] for t, _, _ in seqs]).cumsum(0).tolist()
        spans = [(e - t.shape[0], e, lane, start) for e, (t, lane, start) in zip(ends, seqs)]
        # rows up to a count every product was checked at (the runner's batch Buckets): token 0 at
        # position 0 of the spare lane, never attended to, never read back
        pad = (padded_rows(ends[-1]) if padded_rows is not None else ends[-1]) - ends[-1]
        zeros = torch.zeros(pad, dtype=torch.long, device=dev)
        tokens = torch.cat([t for t, _, _ in seqs] + [zeros])
        positions = torch.cat([torch.arange(s, s + b - a, device=dev) for a, b, _, s in spans] + [zeros])
        lanes = torch.cat([torch.full((b - a,), lane, device=dev) for a, b, lane, _ in spans] + [zeros + kv.spare])

        def attend(i, q):
            return torch.cat([cut_attention(q[a:b], kv.k[i, lane, :s + b - a], kv.v[i, lane, :s + b - a], s)
                              for a, b, lane, s in spans] + [q.new_zeros(pad, q.shape[1] * q.shape[2])])

        h = self.trunk_fused(tokens, positions, lanes, kv, attend, mm=mm, launch=launch)
        return mm(h[[b - 1 for _, b, _, _ in spans]], self.lm_head.weight)

    def mixed_fused(self, seqs: list[tuple[torch.Tensor, int, int]], dec: torch.Tensor, kv, cut_mm, launch,
                    first_head, skinny: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt cuts [(tokens [T], lane, start)] and a padded decode round dec [tokens, positions, lanes]
        in one forward through the fused kernels (CUDA): the cuts' rows first, then the round's. The
        row-wise kernels (norms, q/k norm + RoPE + cache write, silu*up's multiply) take every row at
        once; each product runs twice, the cuts' rows through cut_mm (the row-invariant product of
        prompt cuts, engine/cuda/batch.py: a row's bits those of its grid cut) and the round's rows
        through the round's own kernels at the round's row count (skinny.py: its bits those of a plain
        round). The graphs' body (engine/runner/mixed_graph.py) runs one launch over both where a
        start-up check shows it keeps both kinds' bits; this eager form, for what no graph takes
        (several cuts, no decode graphs), keeps the two. Attention: each cut through
        launch.cut_attention (cut_flash's tiles at absolute positions, so a cut sized off the grid
        keeps its rows' bits), the round through the decode attention. first_head(j, row [hidden]): cut
        j's last-row logits as prefill_step takes them; skinny: the round's products as `decode`'s
        with skinny (else cuBLAS's). Returns (each cut's last-row logits
        [cuts, vocab], the round's logits [P, vocab])."""
        launch = self._launch(launch)
        dev = dec.device
        ends = torch.tensor([t.shape[0] for t, _, _ in seqs]).cumsum(0).tolist()
        spans = [(e - t.shape[0], e, lane, start) for e, (t, lane, start) in zip(ends, seqs)]
        n = ends[-1]
        d_tokens, d_positions, d_lanes = dec[0], dec[1], dec[2]
        tokens = torch.cat([t for t, _, _ in seqs] + [d_tokens])
        positions = torch.cat([torch.arange(s, s + b - a, device=dev) for a, b, _, s in spans] + [d_positions])
        lanes = torch.cat([torch.full((b - a,), lane, device=dev) for a, b, lane, _ in spans] + [d_lanes])

        round_mm = launch.linear if skinny else F.linear
        round_act = launch.gate_up_silu if skinny else (lambda x, w: launch.silu_mul(F.linear(x, w)))

        def mm(x, w):
            return torch.cat([cut_mm(x[:n], w), round_mm(x[n:], w)])

        def act(x, w):
            return torch.cat([launch.silu_mul(cut_mm(x[:n], w)), round_act(x[n:], w)])

        def attend(i, q):
            return torch.cat([launch.cut_attention(q[a:b], kv.k[i, lane, :s + b - a], kv.v[i, lane, :s + b - a], s)
                              for a, b, lane, s in spans] + [launch.attention(kv, i, q[n:], d_lanes, d_positions)])

        h = self.trunk_fused(tokens, positions, lanes, kv, attend, mm=mm, act=act, launch=launch)
        firsts = torch.stack([first_head(j, h[b - 1]) for j, (_, b, _, _) in enumerate(spans)])
        return firsts, round_mm(h[n:], self.lm_head.weight)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor, kv, attend_fn,
               fused: bool = False, skinny: bool = False, launch=None) -> torch.Tensor:
        """One row per entry of the fixed padded batch: tokens, positions, lanes [P]. Writes each
        row's K/V at (lane, position); attend_fn(kv, layer, q, lanes, positions) reads [0, pos].
        skinny (with fused): the matmuls through engine.cuda.skinny. launch (with fused): the
        kernels and their launch mode (engine.cuda.kernels.Launch; None: plain); attend_fn may be
        its `attention`, whose q/k fold the mode may ask for."""

        def write_kv(i, k, v):
            kv.k[i, lanes, positions] = k
            kv.v[i, lanes, positions] = v

        def attend(i, q):
            return attend_fn(kv, i, q, lanes, positions)

        if fused:
            launch = self._launch(launch)
            h = self.trunk_fused(tokens, positions, lanes, kv, attend, skinny=skinny, launch=launch,
                                 attend_qkv=self._qk_folded(attend_fn, kv, lanes, positions, launch))
            return (launch.linear if skinny else F.linear)(h, self.lm_head.weight)
        return self.lm_head(self.trunk(tokens, positions, write_kv, attend))


def cut_io(tokens: torch.Tensor, lane: int, start: int, kv, attention):
    """A prompt cut's positions, its K/V writer into rows [start, end) of `lane`, and its
    attention(q, k, v, start) over the lane's rows [0, end)."""
    end = start + tokens.shape[0]

    def write_kv(i, k, v):
        kv.k[i, lane, start:end] = k
        kv.v[i, lane, start:end] = v

    def attend(i, q):
        return attention(q, kv.k[i, lane, :end], kv.v[i, lane, :end], start)

    return torch.arange(start, end, device=tokens.device), write_kv, attend


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q [T, H, d] at positions [start, start+T); k, v [end, KVH, d] of one lane. Causal,
    aligned at the bottom right (query row t sees keys [0, start + t]). Returns [T, H*d]."""
    t, h, d = q.shape
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if q.is_cuda:  # cuDNN halves, no offset mask (engine/cuda/prefill.py; imported here: CPU runs need no triton)
        from engine.cuda.prefill import cut_attention
        return cut_attention(q, k, v, start)
    if start == 0:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        mask = torch.arange(k.shape[0], device=q.device)[None, :] <= (start + torch.arange(t, device=q.device))[:, None]
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1).reshape(t, h * d)


def decode_attention_loop(kv, i: int, q: torch.Tensor, lanes: torch.Tensor, positions: torch.Tensor,
                          spare: int | None = None, rows: list[tuple[int, int]] | None = None) -> torch.Tensor:
    """Reference decode attention: one SDPA per row over exactly its lane's rows [0, pos].
    `rows` gives (lane, pos) as Python ints (avoids a device sync); rows of the spare lane are
    padding and get zeros. Each row's arithmetic depends on its own length only."""
    p, h, d = q.shape
    out = torch.zeros(p, h * d, dtype=q.dtype, device=q.device)
    if rows is None:
        rows = list(zip(lanes.tolist(), positions.tolist()))
    for r, (lane, pos) in enumerate(rows):
        if lane == spare:
            continue
        k = kv.k[i, lane, :pos + 1].transpose(0, 1)[None]
        v = kv.v[i, lane, :pos + 1].transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(q[r][None, :, None, :], k, v, enable_gqa=True)
        out[r] = o.reshape(h * d)
    return out
