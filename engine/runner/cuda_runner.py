"""CudaRunner: the runner on a CUDA device.

- The decode round is captured as CUDA graphs (engine/runner/decode_graph.py: its first node copies
  the rows in, the only host sync is reading the new ids; greedy rounds may run one ahead,
  engine/runner/ahead.py); decode attention is a Triton split-K kernel with a fixed split size
  (engine/cuda/decode_attention.py); a prompt cut's attention is its prefix and its diagonal through
  cuDNN (or flash), merged (engine/cuda/prefill.py), or cut_flash's tiles. Up to 64 lanes (the
  round's matmuls pad to 16, 32 or 64 rows); the KV cache must fit beside the weights. When capture
  fails, the same round runs eagerly (`graph_fallback_reason` says why).
- Sampled rows (or ones asking for logprobs) are drawn outside the graph from the logits it writes.
- Short prompts fill together through row-invariant matmuls (prefill_many, engine/cuda/batch.py);
  --prefill-mode mixed runs cuts beside a round in one forward (_mixed_fused, engine/runner/mixed_graph.py);
  --prefill-mode split runs a cut on part of the SMs while rounds run on the rest (start_step).

Built on the CPU (tests), the same class runs its kernels under Triton's interpreter: the fused
trunk stays off until switched on, and graphs, threads and device syncs stay off.
"""
from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from engine.config import SHORT_ROWS, ConfigError, EngineConfig, ModelConfig
from engine.cuda.forward import FusedOps, mixed_products, round_kernels
from engine.models.qwen3 import ForwardPlan, TorchOps, decode_attention_loop
from engine.runner.model_runner import ModelRunner, mixed_ids
from engine.runner.decode_graph import DecodeGraphs
from engine.runner.kv_cache import KVCache
from engine.runner.mixed_graph import TILES, MixedGraphs
from engine.scheduler.sampling import SamplingParams

log = logging.getLogger("engine.runner.model_runner")
# CUDA memory kept free beside the weights and the KV cache: a prompt cut's activations, scratch.
KV_HEADROOM = 4 << 30
# Mixed forwards: a sized cut ends on a multiple of this many positions. Any would keep the bits
# (cut_flash's tiles sit at absolute positions, the cut's products run at a checked row count); cut_flash's
# query tile (CutFlashConfig.block_m), so that a cut fills whole tiles: its attention is paid a tile at a time.
MIXED_GRANULE = 128


def warm_cuts(rows: int, max_len: int, split: int | None) -> list[tuple[int, int]]:
    """The (rows, start) of the prompt cuts run at start-up so that Triton compiles before a request
    does: a full cut and a 17-row one (Triton compiles again for an int argument of 1, a multiple
    of 16 or neither), and with cut_flash's key splits one cut reading two splits, the first that
    launches the merge kernel (left to a request, a 32k prompt's third cut takes 0.6 s, not 30 ms,
    in the first server on a machine)."""
    out = [(rows, 0), (17, rows)] if max_len >= rows + 17 else []
    if split is not None and split > rows and max_len >= split + 17:
        out.append((17, split))
    return out


class CudaRunner(ModelRunner):
    def __init__(self, cfg: EngineConfig, model=None):
        # on the CPU (tests): Triton's interpreter runs the kernels; no graphs, threads or device syncs
        self.interpreted = not cfg.device.startswith("cuda")
        super().__init__(cfg, model)
        knobs = cfg.kernels
        self.fused = not self.interpreted and knobs.fused
        self.skinny = self.fused and knobs.skinny
        # cuts of <= SHORT_ROWS rows through row-invariant matmuls, alone or several in one forward
        # (prefill_many): cuBLAS at the row counts checked bitwise here, else the tiles
        self._kernels = None  # engine.cuda.kernels.CudaKernels, made on first use (`kernels`)
        self.batch_cuts, self.batch_rows = self.fused and knobs.batch_cuts, ()
        if self.batch_cuts and knobs.batch_cublas:
            from engine.cuda.batch import adopt_buckets  # (loads triton: not at import)
            a, m = self.model.model.layers[0].self_attn, self.model.model.layers[0].mlp
            self.kernels.batch = adopt_buckets([a.wqkv, a.o_proj.weight, m.w_gate_up, m.down_proj.weight])
            self.batch_rows = self.kernels.batch.rows
        # mixed forwards as graphs (engine/runner/mixed_graph.py)
        self.mixed_graphs: MixedGraphs | None = None
        if cfg.prefill_mode == "mixed" and not self.interpreted:  # (_mixed_fused)
            if why := self._mixed_refused():
                raise ConfigError(why)
            self.cut_free, self.cut_granule = True, MIXED_GRANULE
            if cfg.tensor_parallel == 1:
                self.mixed_graphs = MixedGraphs(self, tiles=TILES if knobs.mixed_low_tiles else ())
                self.cut_sizes = self.mixed_graphs.sizes
        self.graphs = DecodeGraphs(self)  # the decode round's CUDA graphs (capture_graph)
        # --prefill-mode split: the decode and prompt SM partitions, the rounds captured on the
        # decode one, and the cut in flight on the prompt one (start_step)
        self.split_graphs: DecodeGraphs | None = None
        self._inflight: deque[Future] = deque()
        self._split_thread: ThreadPoolExecutor | None = None  # launches those cuts (start_step)
        self._cut_thread: ThreadPoolExecutor | None = None  # where prompt cuts run (in_cut_thread)
        if self.interpreted:
            if knobs.cuda_graph:
                self.capture_graph()  # falls back: records why
            return
        if knobs.cuda_graph is not False:
            self.capture_graph()
        if cfg.prefill_mode == "split":
            self._split_sms()
        # Prompt cuts run in one thread of their own, which builds cuDNN's graphs for the full
        # cuts first (in the background, after the capture), so no request waits for a build.
        # (on this runner's device: a tensor-parallel rank's is not the thread's default, cuda:0)
        self._cut_thread = ThreadPoolExecutor(1, thread_name_prefix="prompt-cuts",
                                              initializer=_on_device, initargs=(self.device,))
        self.cuts_warmed = self._cut_thread.submit(self._warm_cuts)

    def _make_kv(self, mcfg: ModelConfig) -> KVCache:
        if not self.interpreted:
            self._check_kv_fits(mcfg)
        return super()._make_kv(mcfg)

    def _check_kv_fits(self, mcfg: ModelConfig) -> None:
        """A clear error, naming the flags, when the KV cache cannot fit beside the weights."""
        need = KVCache.bytes_for(mcfg, self.parallel, self.max_model_len, self.dtype)
        free, _ = torch.cuda.mem_get_info(self.device)
        if need > free - KV_HEADROOM:
            per_lane = (free - KV_HEADROOM) // max(1, KVCache.bytes_for(mcfg, self.parallel, 1, self.dtype))
            raise ConfigError(
                f"--parallel {self.parallel} with --max-model-len {self.max_model_len}: the KV cache needs "
                f"{need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are free on {self.device} (keeping "
                f"{KV_HEADROOM / 2**30:.0f} GiB for activations); at this --parallel, --max-model-len "
                f"{max(0, per_lane)} fits")

    def _split_sms(self) -> None:
        """Split mode: the device's SMs in two (engine/cuda/partitions.py), the decode rounds captured
        again on the decode partition's stream, so that they run on its SMs alone."""
        from engine.cuda.partitions import split_sms
        if self.cfg.tensor_parallel != 1 or self.graphs.graph is None:
            raise ConfigError(f"--prefill-mode split needs the CUDA decode graph at one rank "
                              f"({self.graph_fallback_reason or 'tensor parallel'})")
        try:
            self.sm_split = split_sms(self.cfg.decode_sms, self.device.index or 0)
        except (ValueError, RuntimeError) as e:
            raise ConfigError(str(e)) from None
        self.split_graphs = DecodeGraphs(self, stream=self.sm_split.decode)
        if not self.split_graphs.capture():
            raise ConfigError(f"--prefill-mode split: {self.split_graphs.fallback_reason}")
        # Their own thread: a launch may wait for the device (two cuts fill a stream's launch queue),
        # and short prompts, which go through the cut thread, must not wait behind it. cuDNN keeps its
        # graphs per thread: this one builds its own at warm-up (_warm_cuts).
        self._split_thread = ThreadPoolExecutor(1, thread_name_prefix="split-cuts", initializer=_on_device,
                                                initargs=(self.device,))
        log.info("split: decode rounds on %d SMs beside prompt cuts on %d", self.sm_split.decode_sms,
                 self.sm_split.prompt_sms)

    @property
    def kernels(self):
        """This runner's CUDA kernel state (engine/cuda/kernels.py CudaKernels: its device's tables,
        the adopted batch buckets, the ring's state); made on first use."""
        if self._kernels is None:
            from engine.cuda.kernels import CudaKernels
            tiles = None
            # cut_tiles: not for a float32 runner on the device (a reference: its halves are plain math,
            # where the tiles' float32 dots would run in tf32)
            if self.cfg.kernels.cut_tiles and (self.interpreted or self.dtype != torch.float32):
                from engine.cuda.cut_flash import for_device
                tiles = for_device(self.device)
            self._kernels = CudaKernels(self.device, tiles=tiles)
        return self._kernels

    @property
    def graph(self):
        """The padded shape's host-fed decode graph, None without graphs (eager rounds)."""
        return self.graphs.graph

    @property
    def decode_pdl(self) -> int:
        """The decode graph's PDL mode (/v1/engine's decode_pdl)."""
        return self.graphs.pdl

    def _launch(self, mode=None):
        """The fused forward's kernels under `mode` (None: plain)."""
        from engine.cuda.launch import PLAIN
        return self.kernels.at(mode or PLAIN)

    # ---- prompt cuts -----------------------------------------------------------------------
    def in_cut_thread(self, fn, *args):
        """fn(*args) where prompt cuts run: the cut thread (its graphs and cuDNN's were built there),
        else here."""
        return fn(*args) if self._cut_thread is None else self._cut_thread.submit(fn, *args).result()

    def prefill_step(self, lane: int, tokens: Sequence[int], start: int, end: int,
                     sampling: SamplingParams | None = None, logprobs: list | None = None) -> int | None:
        tok = super().prefill_step(lane, tokens, start, end, sampling, logprobs)
        if end < len(tokens) and not self.interpreted:
            # The host times each step to charge the decoders' share: a step must not return
            # while its kernels are still queued, or the next decode round pays for it. In split mode
            # its own stream only: a cut may be running beside it on the prompt partition.
            if self.sm_split is None:
                torch.cuda.synchronize(self.device)
            else:
                torch.cuda.current_stream(self.device).synchronize()
        return tok

    @torch.inference_mode()
    def _forward_many(self, seqs) -> torch.Tensor:
        """Cuts [(tokens, lane, start)] in one forward, each cut's bits its own: its last row's logits."""
        # rows up to a count every product was checked at (engine/cuda/batch.py Buckets): padding rows
        k, m = self.kernels, sum(t.shape[0] for t, _, _ in seqs)
        plan = ForwardPlan.of(seqs, pad=k.batch.padded_rows(m) - m, spare=self.spare)
        h = self.model(plan, FusedOps(self.model, self.kv, plan, self._launch(), mm=k.matmul))
        return k.matmul(h[plan.last_rows()], self.model.lm_head.weight)

    @torch.inference_mode()
    def _forward_cut(self, ids: torch.Tensor, lane: int, start: int) -> torch.Tensor:
        """One cut's last row's logits: the fused kernels, or plain torch (the cut attention through
        cuDNN's halves)."""
        plan = ForwardPlan.cut(ids, lane, start)
        ops = FusedOps(self.model, self.kv, plan, self._launch()) if self.fused else TorchOps(self.model, self.kv, plan)
        return self.model.lm_head(self.model(plan, ops)[-1])

    def cut_logits(self, ids: torch.Tensor, lane: int, start: int, fused: bool = False) -> torch.Tensor:
        """Every row's logits of one cut through plain torch (the reference), or with `fused` this
        runner's fused kernels (tests, device checks)."""
        if not fused:
            return super().cut_logits(ids, lane, start)
        plan = ForwardPlan.cut(ids, lane, start)
        with torch.inference_mode():
            return self.model.lm_head(self.model(plan, FusedOps(self.model, self.kv, plan, self._launch())))

    # ---- split mode: one cut on the prompt partition while rounds run on the decode partition ---
    def start_step(self, lane: int, tokens: Sequence[int], start: int, end: int) -> None:
        """Launch one cut [start, end) of lane's prompt on the prompt partition and return at once;
        cuts launched before it run first (`step_done`, `finish_step` take them in order). It runs
        prefill_step's forward, on fewer SMs: the same bits."""
        self._check_cut(lane, len(tokens), start, end)
        part, last = self.sm_split.prompt, end == len(tokens)
        # pinned, so that the copy waits for nothing: from pageable memory it would wait for the cut
        # before it on the stream
        host = torch.tensor(list(tokens[start:end]), dtype=torch.long).pin_memory()

        behind = self._inflight[-1] if self._inflight else None

        @torch.inference_mode()
        def launch():
            if end - start != self.prefill_rows and behind is not None:
                # A prompt's last, partial cut has shapes the warm-up did not build (cuDNN's graph, new
                # allocations), and building them waits for the device: launched behind a running cut,
                # that wait holds the host's next round for the whole cut (81 ms on an H100). Wait
                # for the cut before it here first, off the GIL.
                behind.result()[1].synchronize()
            with torch.cuda.stream(part):
                ids = host.to(self.device, non_blocking=True)
                logits = self._forward_cut(ids, lane, start)
                first = logits.argmax(-1) if last else None
                done = torch.cuda.Event()
                done.record(part)
            return first, done, host  # host: pinned memory kept until the copy has run
        self._inflight.append(self._split_thread.submit(launch))

    def step_done(self) -> bool:
        """Whether the oldest cut in flight has finished on the device (a failed launch counts as done)."""
        if not self._inflight:
            return True
        f = self._inflight[0]
        return f.done() and (f.exception() is not None or f.result()[1].query())

    def finish_step(self) -> int | None:
        """Wait for the oldest cut in flight; its prompt's greedy first token if it was the last cut."""
        first, done, _ = self._inflight.popleft().result()
        done.synchronize()
        return None if first is None else int(first.item())

    @torch.inference_mode()
    def _warm_cuts(self) -> int:
        """cuDNN's graphs for full cuts at every grid start (engine/cuda/prefill.py), then each prompt
        path once in the spare lane (its KV is scratch), so Triton compiles here, not in a first request."""
        from engine.cuda.prefill import warm
        a = self.model.model.layers[0].self_attn

        def build() -> int:
            return 0 if self.kernels.cut_flash else warm(self.kv.k[0, self.spare], self.kv.v[0, self.spare], a.n_heads,
                                                         self.prefill_rows, self.kernels.cuts)
        built = build()
        if self._split_thread is not None:  # split mode's cuts launch from a thread of their own, on their stream

            def build_there() -> int:
                with torch.cuda.stream(self.sm_split.prompt):
                    n = build()
                torch.cuda.synchronize(self.device)
                return n
            built += self._split_thread.submit(build_there).result()
        if self.cfg.tensor_parallel > 1:  # its forwards meet other ranks' collectives: not checked on 2 GPUs yet
            return built
        # Triton compiles again for an int argument of 1, a multiple of 16 or neither: 17 and 32 rows, 1 and 2 cuts
        r, n = self.prefill_rows, self.max_model_len
        ids = torch.zeros(max(r, 32), dtype=torch.long, device=self.device)
        split = self.kernels.cut_flash.split if self.kernels.cut_flash is not None else None
        for rows, start in warm_cuts(r, n, split):
            self._forward_cut(ids[:rows], self.spare, start)
        if self.batch_cuts and n >= 96:
            self._forward_many([(ids[:17], self.spare, 0)])
            self._forward_many([(ids[:17], self.spare, 0), (ids[:32], self.spare, 64)])
        if self.cfg.prefill_mode == "mixed" and self.cut_free and self.parallel >= 2 and n >= 32:
            # the round's kernels eagerly (the graphs were captured in other launch modes) beside a cut,
            # at 18 and 32 rows in all; lanes 0 and 1 hold nothing yet, and their first prompt overwrites
            zeros = [0] * 31
            self._mixed_fused([(1, zeros, 0, 17)], [0], [0], [0], here=True)
            self._mixed_fused([(1, zeros, 0, 31)], [0], [0], [0], here=True)
            if self.mixed_graphs is not None and self.graphs.rounds:  # (no decode graphs: none here either)
                self.mixed_graphs.capture()
        if not self.interpreted:
            torch.cuda.synchronize(self.device)
        return built

    # ---- one forward carrying both ------------------------------------------------------------
    def _mixed(self, cuts, lanes, tokens, positions) -> tuple[list[int | None], list[int]]:
        """One forward with cut_flash's tiles (_mixed_fused), else the cuts, then the round."""
        if self.fused and self.kernels.cut_flash is not None:
            return self._mixed_fused(cuts, lanes, tokens, positions)
        return self._one_after_other(cuts, lanes, tokens, positions)

    def _mixed_refused(self) -> str | None:
        """Why this runner's mixed forwards could not keep every row's bits, or None."""
        if not self.fused or self.kernels.cut_flash is None:
            return ("--prefill-mode mixed on cuda needs the fused kernels and --cut-attention tiles in bfloat16 "
                    "(a cut's attention bits must not depend on where the cut falls)")
        r, rows = self.prefill_rows, self.batch_rows
        if not rows:
            return ("--prefill-mode mixed on cuda: the start-up check found no row counts at which cuBLAS gives "
                    "every prompt row the same bits, so a cut sized off the grid would move them")
        if r > SHORT_ROWS and r not in rows:
            return (f"--prefill-mode mixed on cuda: --prefill-rows {r} is not a row count cuBLAS was checked at "
                    f"({', '.join(map(str, rows))}), so a grid cut's bits and a sized cut's could differ")
        return None

    @torch.inference_mode()
    def _mixed_fused(self, cuts, lanes, tokens, positions, here: bool = False) -> tuple[list[int | None], list[int]]:
        """The cuts' products through the prompt cuts' row-invariant product (cuBLAS at the checked
        counts), the round's through its own kernels at its row count, so each row keeps the bits its
        own call gives it. here: in the calling thread (the cut thread's own warm-up), else in the cut
        thread, as prompt cuts run."""
        self._check_mixed(cuts, lanes)
        rows, where = self.padded_round(lanes, tokens, positions)
        if self.ahead is not None:
            self.ahead.drop()  # this forward writes rows a round ahead would read
        k = self.kernels
        w = self.model.lm_head.weight
        # the last row's logits as prefill_step computes them for a cut of that length: a short cut
        # through the row-invariant product (prefill_many), a long one as one vector (prefill)
        many = [self.batch_cuts and e - s <= SHORT_ROWS for _, _, s, e in cuts]

        def first_head(j, row):
            return k.matmul(row[None], w)[0] if many[j] else torch.nn.functional.linear(row, w)

        shape = None if self.mixed_graphs is None else self.mixed_graphs.takes(cuts, len(rows[0]))
        if shape is not None:  # one replay (engine/runner/mixed_graph.py)
            (lane, toks, s, e), = cuts

            @torch.inference_mode()
            def replay():
                last, ids = self.mixed_graphs.run(shape, lane, toks[s:e], s, rows)
                first = int(first_head(0, last).argmax().item()) if e == len(toks) else None
                return [first], [ids[row] for row in where]
            return replay() if here else self.in_cut_thread(replay)
        seqs = [(torch.tensor(list(t[s:e]), dtype=torch.long, device=self.device), lane, s) for lane, t, s, e in cuts]
        dec = torch.tensor(rows, dtype=torch.long, device=self.device)

        @torch.inference_mode()  # (per thread: the cut thread's call needs its own)
        def run():
            plan = ForwardPlan.of(seqs, dec)
            # every row-wise kernel over all rows at once; each product twice (engine/cuda/forward.py
            # mixed_products); each cut's attention through cut_flash's tiles at absolute positions
            launch = self._launch()
            mm, act = mixed_products(plan.n, k.matmul, launch, self.skinny)
            h = self.model(plan, FusedOps(self.model, self.kv, plan, launch, mm=mm, act=act))
            firsts = torch.stack([first_head(j, h[r]) for j, r in enumerate(plan.last_rows())])
            return firsts, round_kernels(launch, self.skinny)[0](h[plan.n:], w)
        first_logits, logits = run() if here else self.in_cut_thread(run)
        return mixed_ids(cuts, first_logits, logits, where)

    # ---- decode rounds -----------------------------------------------------------------------
    def _round(self, rows, lanes, ahead: bool, greedy: bool) -> tuple[list[int], torch.Tensor]:
        """A padded round's logits and ids: on the decode partition while a split's cut runs, run
        ahead, replayed, or eagerly (the same bits every way)."""
        if self._inflight and self._graph_takes(lanes) and (self.ahead is None or self.ahead.pending is None):
            # a split's cut runs on the prompt partition: the round on the decode partition's SMs
            with torch.cuda.stream(self.sm_split.decode):
                out = self.split_graphs.fresh(rows).tolist()
            return out, self.split_graphs.rounds[len(rows[0])].s_logits
        if self.ahead is not None and (self.graph is None or self._graph_takes(lanes)):
            out = self.ahead.round(rows, ahead, greedy)  # engine/runner/ahead.py
            return out, self.graphs.rounds[len(rows[0])].s_logits
        if self._graph_takes(lanes):
            out = self.graphs.fresh(rows).tolist()
            return out, self.graphs.rounds[len(rows[0])].s_logits
        return self._eager_round(rows)  # (a round of several rows a lane: see _graph_takes)

    def _graph_takes(self, lanes: Sequence[int]) -> bool:
        """Whether a round of these lanes replays the graph: not where a lane has several rows and
        the graph has the q/k fold (eager rounds run the unfolded kernels: the same bits)."""
        return self.graph is not None and not (self.graphs.qk_fold and len(set(lanes)) < len(lanes))

    def round_logits(self, inp: torch.Tensor, mode) -> torch.Tensor:
        """A decode round's logits from inp [tokens, positions, lanes, ...] on the device, its kernels
        launched in `mode` (engine/cuda/launch.py LaunchMode): what the decode graphs capture."""
        return self._decode_body(inp, mode=mode)

    def _decode_body(self, inp: torch.Tensor, rows=None, mode=None) -> torch.Tensor:
        """The round's logits [parallel, vocab]; mode: the kernels' launch mode (None: plain);
        rows: the round's (lane, position) pairs as Python ints, where the attention wants them."""
        plan, kv = ForwardPlan.round(inp[0], inp[1], inp[2]), self.kv
        attend = None  # the launch's decode attention
        if self.interpreted:  # the interpreter's checks: the reference loop's attention

            def attend(i, q):
                return decode_attention_loop(kv, i, q, plan.lanes, plan.positions, spare=self.spare, rows=rows)
        if not self.fused:
            if attend is None:
                def attend(i, q):
                    return self.kernels.at().attention(kv, i, q, plan.lanes, plan.positions)
            return self.model.lm_head(self.model(plan, TorchOps(self.model, kv, plan, round_attention=attend)))
        launch = self._launch(mode)
        a = self.model.model.layers[0].self_attn
        fold = attend is None and launch.mode.fold_qk_norm and launch.qk_fold_takes(a.n_heads, a.n_kv, a.head_dim)
        h = self.model(plan, FusedOps(self.model, kv, plan, launch, skinny=self.skinny, fold=fold, round_attention=attend))
        return round_kernels(launch, self.skinny)[0](h, self.model.lm_head.weight)

    def capture_graph(self) -> bool:
        """Capture the decode round at each of its row counts (engine/runner/decode_graph.py); on
        failure (or on the CPU) fall back to eager rounds and say why. Returns whether a graph is in use."""
        ok = self.graphs.capture()
        self.buckets, self.ahead = self.graphs.rows, self.graphs.ahead
        self.graph_fallback_reason = self.graphs.fallback_reason
        return ok


def _on_device(device: torch.device) -> None:
    """A thread's CUDA device, where the runner names one (Triton launches on the current device)."""
    if device.index is not None:
        torch.cuda.set_device(device)
