"""The runner's shared core: the real engine.scheduler.backend.Backend, less its forwards. Only the
runners (this core and a device's: engine/runner/cpu_runner.py, engine/runner/cuda_runner.py;
engine/runner/build.py picks one by --device) turn lanes and ids into tensors.

- `prefill_step(lane, tokens, start, end, sampling=None, logprobs=None)`: one cut of one lane,
  causal over the lane's rows [0, end); on the prompt's last cut returns the first token (lm_head
  for the last row only): greedy, or drawn per `sampling` (engine/runner/sampler.py).
- `decode(lanes, tokens, positions, sampling=None, logprobs=None)`: one batched forward at the
  padded shape `parallel`, or at fewer rows where every product takes the same kernel and tiles
  (`buckets`, engine/runner/decode_graph.py): row r always carries lane r; rows of lanes not decoding
  point at a spare KV lane whose writes go nowhere harmful. Linear layers thus always run the
  same tiles, and each row's attention reads its own lane's rows [0, pos] in an order that
  depends on that length only, so a row's bits never depend on how many neighbours decode or
  how long they are.
- Sampling: greedy rows take the round's argmax as always; a sampled row (or one asking for
  logprobs) is drawn outside the graph from the logits the graph writes, from its own row only.
  `sampling` is one SamplingParams per entry (None: all greedy); `logprobs`, when given, gets
  one TokenLogprob or None appended per returned token.

A device's runner gives the forwards: `_forward_cut` (one cut's last row's logits), `_forward_many`
(several cuts' in one forward), `_decode_body` (a round's logits), `_round` (how a round runs: graphs,
rounds ahead, the C++ round, or eagerly) and `_mixed` (cuts and a round in one forward). Kernel
choices come from `EngineConfig.kernels` (engine.config.KernelConfig). Fault and slow-down hooks for
tests live in a wrapper backend (engine/faults.py), not here.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.config import SHORT_ROWS, EngineConfig, ModelConfig
from engine.cpu.cut_attention import tile_for
from engine.runner.kv_cache import KVCache
from engine.scheduler.backend import Capabilities, round_rows
from engine.models.qwen3 import ForwardPlan, TorchOps
from engine.models.presets import resolve_model
from engine.runner.sampler import choose
from engine.scheduler.sampling import SamplingParams
from engine.models.tokenizer import load_tokenizer
from engine.models.weights import DTYPES, load_model


def mixed_ids(cuts, first_logits: torch.Tensor, logits: torch.Tensor, where: list[int]) -> tuple[list[int | None], list[int]]:
    """A mixed forward's greedy answer: each cut's first token where it ends its prompt (else None),
    and the round's ids at its entries' rows."""
    firsts, out = first_logits.argmax(-1).tolist(), logits.argmax(-1).tolist()
    return [int(f) if e == len(t) else None for f, (_, t, _, e) in zip(firsts, cuts)], [out[row] for row in where]


class ModelRunner:
    """What every device's runner shares (module doc); the device's subclass sets up its kernels."""

    graph = None  # the padded shape's decode graph (CudaRunner's, where captured)
    sm_split = None  # the SM partitions of --prefill-mode split (CudaRunner's)

    def __init__(self, cfg: EngineConfig, model=None):
        """`model`: reuse an already loaded (fused) model of the same shape (bench comparisons)."""
        self.cfg = cfg
        mcfg, name, model_dir = resolve_model(cfg.model)
        self.device = torch.device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        self.model_config: ModelConfig = mcfg
        self.model_name: str = name
        self.model_dir = model_dir
        self.parallel: int = cfg.parallel
        self.max_model_len: int = cfg.max_model_len
        self.prefill_rows: int = cfg.prefill_rows
        self.vocab_size: int = mcfg.vocab_size
        self.eos_token_ids: tuple[int, ...] = mcfg.eos_token_ids  # a reply stops at any of them
        self.tokenizer = load_tokenizer(model_dir, mcfg.vocab_size, mcfg.eos_token_id)

        if model is None:
            model = load_model(mcfg, cfg.load_format, model_dir, self.device, self.dtype, cfg.seed)
            model.fuse()
        self.model = model
        if model.cos is None or model.cos.shape[0] < cfg.max_model_len:
            model.setup_rope(cfg.max_model_len)
        # the model's own shape: a tensor-parallel rank's holds its share of the KV heads
        self.kv = self._make_kv(model.config)
        self.spare = self.kv.spare

        # what the device's runner may change once its kernels are chosen
        self.fused = self.skinny = False  # CUDA's Triton kernels around the matmuls, its skinny decode matmuls
        self.batch_cuts = False  # short cuts filled together in one forward (prefill_many)
        self.round_rows = cfg.parallel  # the padded shape: the most rows a decode round has
        self.buckets: tuple[int, ...] = (self.round_rows,)  # the row counts rounds run at
        # whether a cut keeps its rows' bits wherever it starts and ends: the host may size it freely
        self.cut_free = False
        # the cut attention computes whole tiles: a sized cut ends at their ends
        self.cut_granule = tile_for(cfg.prefill_rows)
        self.cut_sizes: tuple[int, ...] | None = None  # the cut rows the host's budget picks among (None: any)
        self.ahead = None  # rounds launched one ahead (engine/runner/ahead.py Ahead)
        self.graph_fallback_reason: str | None = None

    def _make_kv(self, mcfg: ModelConfig) -> KVCache:
        return KVCache(mcfg, self.parallel, self.max_model_len, self.dtype, self.device)

    # ---- prompt cuts -----------------------------------------------------------------------
    @torch.inference_mode()
    def prefill_step(self, lane: int, tokens: Sequence[int], start: int, end: int,
                     sampling: SamplingParams | None = None, logprobs: list | None = None) -> int | None:
        n = len(tokens)
        self._check_cut(lane, n, start, end)
        if self.batch_cuts and end - start <= SHORT_ROWS:  # the same forward as beside other cuts
            (tok,), logits = self._many([(lane, tokens, start, end)])
        else:
            ids = torch.tensor(list(tokens[start:end]), dtype=torch.long, device=self.device)
            logits = self.in_cut_thread(self._forward_cut, ids, lane, start)
            tok = int(logits.argmax(-1).item()) if end == n else None
        if end != n:
            return None
        if sampling is None or sampling.plain:
            return tok
        return choose(logits.reshape(1, -1), [tok], [sampling], [n], logprobs)[0]

    def in_cut_thread(self, fn, *args):
        """fn(*args) where prompt cuts run: here (CudaRunner: its cut thread)."""
        return fn(*args)

    def _check_cut(self, lane: int, n: int, start: int, end: int) -> None:
        if not (0 <= lane < self.parallel):
            raise ValueError(f"lane {lane} outside 0..{self.parallel - 1}")
        if not (0 <= start < end <= n):
            raise ValueError(f"bad cut [{start}, {end}) of a {n}-token prompt")
        if end > self.max_model_len:
            raise ValueError(f"prompt of {n} tokens exceeds max_model_len {self.max_model_len}")

    @torch.inference_mode()
    def prefill_many(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[int | None]:
        """Several prompt cuts [(lane, tokens, start, end)], one per lane. With batch_cuts, cuts of at
        most SHORT_ROWS rows go in one forward through row-invariant products (the CPU's tiles of the
        cut's rows, CUDA's checked counts: engine/cuda/batch.py), so each cut's bits equal its bits
        alone; otherwise one after another. Returns per cut the greedy first token if it ends its
        prompt, else None."""
        if not (self.batch_cuts and all(e - s <= SHORT_ROWS for _, _, s, e in items)):
            return [self.prefill_step(*it) for it in items]
        if len({it[0] for it in items}) < len(items):
            raise ValueError("two cuts of one lane in one forward")
        for lane, tokens, start, end in items:
            self._check_cut(lane, len(tokens), start, end)
        return self._many(items)[0]

    def _many(self, items) -> tuple[list[int | None], torch.Tensor]:
        seqs = [(torch.tensor(list(t[s:e]), dtype=torch.long, device=self.device), lane, s) for lane, t, s, e in items]
        logits = self.in_cut_thread(self._forward_many, seqs)
        firsts = logits.argmax(-1).tolist()  # the one sync: the cuts' work is done when it returns
        return [int(f) if e == len(t) else None for f, (_, t, _, e) in zip(firsts, items)], logits

    def cut_logits(self, ids: torch.Tensor, lane: int, start: int) -> torch.Tensor:
        """Every row's logits of one cut through plain torch: the reference (tests, device checks)."""
        plan = ForwardPlan.cut(ids, lane, start)
        with torch.inference_mode():
            return self.model.lm_head(self.model(plan, TorchOps(self.model, self.kv, plan)))

    def prefill(self, lane: int, tokens: Sequence[int], start: int = 0, sampling: SamplingParams | None = None) -> int:
        """The whole prompt from `start`, cut by cut on the grid: the same forwards as stepping."""
        from engine.scheduler.backend import cuts
        out = None
        for s, e in cuts(start, len(tokens), self.prefill_rows):
            out = self.prefill_step(lane, tokens, s, e, sampling)
        return out

    # ---- one forward carrying both ------------------------------------------------------------
    @torch.inference_mode()
    def mixed(self, cuts: Sequence[tuple[int, Sequence[int], int, int]], lanes: Sequence[int],
              tokens: Sequence[int], positions: Sequence[int]) -> tuple[list[int | None], list[int]]:
        """Prompt cuts [(lane, tokens, start, end)] and one greedy decode round in one forward
        (engine/scheduler/backend.py MixedBackend): each cut's rows with the bits `prefill_step`
        gives them and each decode row with the bits `decode` gives it, where the device's kernels
        keep both (its `_mixed`); elsewhere the cuts, then the round. Returns (per cut its greedy
        first token if it ends its prompt, else None; the round's ids)."""
        if not (len(lanes) == len(tokens) == len(positions)) or not lanes:
            raise ValueError("a mixed forward needs decode entries, lanes, tokens and positions alike")
        return self._mixed(cuts, lanes, tokens, positions)

    def _one_after_other(self, cuts, lanes, tokens, positions) -> tuple[list[int | None], list[int]]:
        """`mixed` where one forward could not keep every row's bits: the cuts, then the round."""
        return [self.prefill_step(*c) for c in cuts], self.decode(lanes, tokens, positions)

    def _check_mixed(self, cuts, lanes) -> None:
        taken = set(lanes)
        for lane, toks, start, end in cuts:
            self._check_cut(lane, len(toks), start, end)
            if lane in taken:
                raise ValueError(f"lane {lane} twice in one mixed forward")
            taken.add(lane)

    # ---- decode rounds -----------------------------------------------------------------------
    def padded_round(self, lanes, tokens, positions) -> tuple[list[list[int]], list[int]]:
        """[tokens, positions, lanes] of the round's row count (the fewest of `buckets` holding its
        highest lane and all its entries), and the row each entry went to. A lane's first entry
        sits in row `lane`, as in every plain round; further entries of the same lane (a
        drafter's tokens to verify, at the next positions) take rows no lane of this round owns.
        Every row writes its K/V before any row attends, so a draft row sees the rows before it
        exactly as a later plain round would."""
        if len(lanes) > self.round_rows:
            raise ValueError(f"{len(lanes)} rows in one decode round; the round has {self.round_rows}")
        p = round_rows(self.buckets, lanes)
        tok, pos, ln = [0] * p, [0] * p, [self.spare] * p
        owned = set(lanes)
        spare_rows = (r for r in range(p) if r not in owned)
        where = []
        for lane, t, q in zip(lanes, tokens, positions):
            if not (0 <= lane < self.parallel):
                raise ValueError(f"lane {lane} outside 0..{self.parallel - 1}")
            if not (0 <= q < self.max_model_len):
                raise ValueError(f"position {q} outside the lane (max_model_len {self.max_model_len})")
            if not (0 <= t < self.vocab_size):
                raise ValueError(f"token id {t} outside the vocabulary")
            row = lane if ln[lane] == self.spare else next(spare_rows, None)
            if row is None:
                raise ValueError(f"no free row for another entry of lane {lane}")
            tok[row], pos[row], ln[row] = t, q, lane
            where.append(row)
        return [tok, pos, ln], where

    @torch.inference_mode()
    def decode(self, lanes: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
               sampling: Sequence[SamplingParams] | None = None, logprobs: list | None = None,
               ahead: bool = False) -> list[int]:
        """`ahead`: the caller expects the next round to feed these lanes their ids at the next
        positions; where the runner runs rounds ahead (engine/runner/ahead.py) it launches that round now."""
        if not (len(lanes) == len(tokens) == len(positions)):
            raise ValueError("lanes, tokens and positions differ in length")
        if not lanes:
            return []
        rows, where = self.padded_round(lanes, tokens, positions)
        greedy = sampling is None or all(sp.plain for sp in sampling)
        out, logits = self._round(rows, lanes, ahead and len(set(lanes)) == len(lanes), greedy)
        ids = [out[row] for row in where]
        if greedy:
            return ids
        # the new token of an entry fed at position q sits at q + 1
        return choose(logits[where], ids, sampling, [q + 1 for q in positions], logprobs)

    def _eager_round(self, rows) -> tuple[list[int], torch.Tensor]:
        """A round run here and now: its ids and logits. A round in flight ahead is dropped (its rows
        are not these)."""
        if self.ahead is not None:
            self.ahead.drop()
        inp = torch.tensor(rows, dtype=torch.long, device=self.device)
        logits = self._decode_body(inp, rows=list(zip(rows[2], rows[1])))
        return logits.argmax(-1).tolist(), logits

    @property
    def runs_ahead(self) -> bool:
        """Whether decode(..., ahead=True) launches the next round before returning (engine/runner/ahead.py)."""
        return self.ahead is not None

    @property
    def caps(self) -> Capabilities:
        """What the lane host may ask of this runner (backend.Capabilities), from what it set up."""
        return Capabilities(cut_granule=self.cut_granule, cut_sizes=self.cut_sizes, cut_free=self.cut_free,
                            batch_cuts=self.batch_cuts, runs_ahead=self.runs_ahead, mixed=True,
                            split=self.sm_split is not None, round_sizes=tuple(self.buckets))

    # ---- helpers -----------------------------------------------------------------------------
    def generate(self, tokens: Sequence[int], max_tokens: int, lane: int = 0, stop_at_eos: bool = False,
                 sampling: SamplingParams | None = None) -> list[int]:
        """Tokens for one prompt alone in `lane` (tests, checks, bench): greedy unless `sampling`."""
        out = [self.prefill(lane, tokens, sampling=sampling)]
        pos = len(tokens)
        while len(out) < max_tokens and pos < self.max_model_len:
            if stop_at_eos and out[-1] in self.eos_token_ids:
                break
            out.append(self.decode([lane], [out[-1]], [pos], None if sampling is None else [sampling],
                                   ahead=len(out) + 1 < max_tokens)[0])
            pos += 1
        return out

    def generate_together(self, prompts: Sequence[Sequence[int]], lanes: Sequence[int], max_tokens: int) -> list[list[int]]:
        """Greedy tokens for several prompts, each in its lane, decoded in the same rounds (checks, bench)."""
        outs = [[self.prefill(lane, p)] for lane, p in zip(lanes, prompts)]
        pos = [len(p) for p in prompts]
        while len(outs[0]) < max_tokens:
            for o, t in zip(outs, self.decode(list(lanes), [o[-1] for o in outs], pos, ahead=len(outs[0]) + 1 < max_tokens)):
                o.append(t)
            pos = [q + 1 for q in pos]
        return outs

    def describe(self) -> dict:
        """What /v1/engine and the receipts report of this runner (engine/runner/report.py)."""
        from engine.runner.report import describe
        return describe(self)

