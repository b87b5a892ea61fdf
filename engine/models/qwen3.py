"""A Qwen3 decoder, readable top to bottom (gpt-fast style).

embedding -> per layer: RMSNorm -> attention (q/k/v/o without bias, per-head RMSNorm on q and k,
RoPE, grouped-query) -> residual -> RMSNorm -> SwiGLU MLP -> residual -> final norm -> lm_head.

Parameter names are Hugging Face's Qwen3 names, so an HF safetensors directory loads with strict
name matching. Arithmetic follows HF's (RMSNorm in float32, RoPE tables in float32 cast to the
model dtype, rotate-half), so float32 logits agree with `transformers` within rounding.

One forward (`Qwen3ForCausalLM.forward`), driven by a `ForwardPlan`: which rows (prompt cuts, then
a decode round's rows), which cache slots they write (a cut's lane from its start; a round row's
lane at its position) and which attention each reads (a cut: causal over its lane's rows up to its
end; a round row: its own lane's rows [0, pos]). Every forward the engine runs is a plan: a prompt
cut, several short cuts together, a decode round, a cut and a round in one forward. What runs the
products, norms and attention is the `ops` the runner hands in, bound to the plan: `TorchOps` below
(plain torch, the reference), the CPU's (engine/cpu/forward.py) or the fused CUDA kernels'
(engine/cuda/forward.py); each gives a row the same arithmetic whatever the rows beside it.

After loading, `fuse()` concatenates q/k/v and gate/up into one matrix each and re-points the HF
parameters as views into it: one matmul instead of three, no extra memory, names unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

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

    def heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """qkv [rows, (H + 2 KVH) * d] (the q/k/v product) -> q [rows, H, d], k and v [rows, KVH, d],
        q and k normed and rotated."""
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


# ---- the forward plan --------------------------------------------------------------------------
Cut = tuple[int, int, int, int]  # (a, b, lane, start): rows [a, b) carry positions [start, start + b - a) of lane


@dataclass(frozen=True)
class ForwardPlan:
    """One forward's rows, in order: prompt cuts (`cuts`), then `pad` padding rows (token 0 at
    position 0 of the spare lane: written, never attended to, never read back), then from row `n`
    on a decode round's rows (one a row, each at its lane and position; the round's padding rows
    point at the spare lane). tokens, positions, lanes: [rows] on the device."""

    tokens: torch.Tensor
    positions: torch.Tensor
    lanes: torch.Tensor
    cuts: tuple[Cut, ...] = ()
    n: int = 0  # the rows before the round's: the cuts' and their padding
    pad: int = 0

    @classmethod
    def cut(cls, tokens: torch.Tensor, lane: int, start: int) -> "ForwardPlan":
        """One prompt cut: tokens [T] at positions [start, start + T) of `lane`."""
        t = tokens.shape[0]
        positions = torch.arange(start, start + t, device=tokens.device)
        return cls(tokens, positions, torch.full_like(positions, lane), ((0, t, lane, start),), t)

    @classmethod
    def of(cls, seqs: list[tuple[torch.Tensor, int, int]], dec: torch.Tensor | None = None, pad: int = 0,
           spare: int = 0) -> "ForwardPlan":
        """Prompt cuts [(tokens [T], lane, start)] one after another, `pad` padding rows in the spare
        lane, then the decode round dec [tokens, positions, lanes, ...] [>= 3, P] (None: no round)."""
        if dec is not None and not seqs:
            return cls.round(dec[0], dec[1], dec[2])
        dev = seqs[0][0].device
        ends = torch.tensor([t.shape[0] for t, _, _ in seqs]).cumsum(0).tolist()
        cuts = tuple((e - t.shape[0], e, lane, start) for e, (t, lane, start) in zip(ends, seqs))
        zeros = torch.zeros(pad, dtype=torch.long, device=dev)
        tokens = [t for t, _, _ in seqs] + [zeros]
        positions = [torch.arange(s, s + b - a, device=dev) for a, b, _, s in cuts] + [zeros]
        lanes = [torch.full((b - a,), lane, device=dev) for a, b, lane, _ in cuts] + [zeros + spare]
        if dec is not None:
            tokens, positions, lanes = tokens + [dec[0]], positions + [dec[1]], lanes + [dec[2]]
        return cls(torch.cat(tokens), torch.cat(positions), torch.cat(lanes), cuts, ends[-1] + pad, pad)

    @classmethod
    def round(cls, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor) -> "ForwardPlan":
        """A decode round: one row an entry, [P] each."""
        return cls(tokens, positions, lanes)

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def has_round(self) -> bool:
        return self.n < self.rows

    def last_rows(self) -> list[int]:
        """Each cut's last row (its logits give the prompt's next token)."""
        return [b - 1 for _, b, _, _ in self.cuts]

    def write_kv(self, kv, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Layer i's K/V rows into their cache slots: each cut's from its start in its lane, each round
        row's at its lane and position. (The fused kernels write every row, padding too, themselves.)"""
        for a, b, lane, s in self.cuts:
            kv.k[i, lane, s:s + b - a] = k[a:b]
            kv.v[i, lane, s:s + b - a] = v[a:b]
        if self.has_round:
            n = self.n
            lanes, positions = self.lanes[n:], self.positions[n:]
            kv.k[i, lanes, positions] = k[n:] if n else k
            kv.v[i, lanes, positions] = v[n:] if n else v


class Ops(Protocol):
    """The kernels one forward runs on, bound to its plan (and the cache it writes)."""

    def embed_norm(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, h): the embedded rows, and layer 0's input norm of them."""

    def mm(self, x: torch.Tensor, i: int, name: str) -> torch.Tensor:
        """x times layer i's matrix `name` (qkv, o, gate_up, down)."""

    def attention(self, i: int, qkv: torch.Tensor, plan: ForwardPlan) -> torch.Tensor:
        """Layer i's q/k norm and RoPE, the K/V write into the plan's slots, and each row's attention."""

    def act(self, h: torch.Tensor, i: int) -> torch.Tensor:
        """silu(gate) * up of layer i's gate/up product of h."""

    def add_norm(self, x: torch.Tensor, a: torch.Tensor, i: int, name: str, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + the sum over ranks of mm(a, i, name), norm of it)."""


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
        # and, in the fused kernels, the sum fused with the add + norm after it (TensorParallel's
        # fused_write / fused_add_norm); None: sum, then add_rmsnorm
        self.tp_fused = None

    def summed(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.tp_reduce is None else self.tp_reduce(y)

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

    def weight(self, i: int, name: str) -> torch.Tensor:
        """Layer i's matrix `name` (qkv, o, gate_up, down: the fused ones where fuse() ran)."""
        layer = self.model.layers[i]
        if name == "qkv":
            return layer.self_attn.wqkv
        if name == "o":
            return layer.self_attn.o_proj.weight
        return layer.mlp.w_gate_up if name == "gate_up" else layer.mlp.down_proj.weight

    # ---- the forward -----------------------------------------------------------------------
    def forward(self, plan: ForwardPlan, ops: Ops) -> torch.Tensor:
        """Every forward the engine runs: the plan's rows through the layers on `ops`. Returns the
        final norm's rows [rows, hidden]; the caller takes the logits of the rows it needs."""
        layers = self.model.layers
        x, h = ops.embed_norm(plan.tokens)
        for i, layer in enumerate(layers):
            o = ops.attention(i, ops.mm(h, i, "qkv"), plan)
            x, h = ops.add_norm(x, o, i, "o", layer.post_attention_layernorm)
            after = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            x, h = ops.add_norm(x, ops.act(h, i), i, "down", after)
        return h


# ---- the reference kernels: plain torch --------------------------------------------------------
class TorchOps:
    """The forward in plain torch ops (HF's arithmetic): the reference the fast kernels are held
    to, and any device's path without them. cut_attention(q, k, v, start) over a lane's rows
    [0, end) (default `prefill_attention`); round_attention(i, q) for a decode round's rows
    (default `decode_attention_loop`, one SDPA a row)."""

    def __init__(self, model: Qwen3ForCausalLM, kv, plan: ForwardPlan, cut_attention=None, round_attention=None,
                 rows: list[tuple[int, int]] | None = None):
        """rows: the round's (lane, position) pairs as Python ints, for the reference loop (no sync)."""
        self.model, self.kv = model, kv
        self.cos, self.sin = model.cos[plan.positions], model.sin[plan.positions]
        self.cut_attention = cut_attention or prefill_attention
        if round_attention is None and plan.has_round:
            lanes, positions, spare = plan.lanes[plan.n:], plan.positions[plan.n:], kv.spare

            def round_attention(i, q):
                return decode_attention_loop(kv, i, q, lanes, positions, spare=spare, rows=rows)
        self.round_attention = round_attention

    def embed_norm(self, tokens):
        x = self.model.model.embed_tokens(tokens)
        return x, self.model.model.layers[0].input_layernorm(x)

    def mm(self, x, i, name):
        a = self.model.model.layers[i].self_attn
        if name == "qkv" and a.wqkv is None:  # (an unfused model: three products)
            return torch.cat([a.q_proj(x), a.k_proj(x), a.v_proj(x)], dim=-1)
        return F.linear(x, self.model.weight(i, name))

    def attention(self, i, qkv, plan):
        q, k, v = self.model.model.layers[i].self_attn.heads(qkv, self.cos, self.sin)
        plan.write_kv(self.kv, i, k, v)
        kv, n = self.kv, plan.n
        outs = [self.cut_attention(q[a:b], kv.k[i, lane, :s + b - a], kv.v[i, lane, :s + b - a], s)
                for a, b, lane, s in plan.cuts]
        if plan.has_round:
            outs.append(self.round_attention(i, q[n:]))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def act(self, h, i):
        m = self.model.model.layers[i].mlp
        if m.w_gate_up is not None:
            gate, up = F.linear(h, m.w_gate_up).chunk(2, dim=-1)
        else:
            gate, up = m.gate_proj(h), m.up_proj(h)
        return F.silu(gate) * up

    def add_norm(self, x, a, i, name, norm):
        x = x + self.model.summed(F.linear(a, self.model.weight(i, name)))
        return x, norm(x)


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
