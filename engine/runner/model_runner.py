"""ModelRunner: the real engine.scheduler.backend.Backend. Only this module turns lanes and ids into tensors.

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
- CUDA: the decode round is captured as CUDA graphs (engine/runner/decode_graph.py: its first node copies
  the rows in, the only host sync is reading the new ids; greedy rounds may run one ahead,
  engine/runner/ahead.py); decode attention is a Triton split-K kernel with a
  fixed split size (engine/cuda/decode_attention.py); a prompt cut's attention is its prefix and its diagonal
  through cuDNN (or flash), merged (engine/cuda/prefill.py). Up to 64 lanes (the round's
  matmuls pad to 16, 32 or 64 rows); the KV cache must fit beside the weights. On CPU, or
  when capture fails, the same round runs eagerly (`graph_fallback_reason` says why).
- Sampling: greedy rows take the round's argmax as always; a sampled row (or one asking for
  logprobs) is drawn outside the graph from the logits the graph writes, from its own row only.
  `sampling` is one SamplingParams per entry (None: all greedy); `logprobs`, when given, gets
  one TokenLogprob or None appended per returned token.

Kernel choices come from `EngineConfig.kernels` (engine.config.KernelConfig). Fault and
slow-down hooks for tests live in a wrapper backend (engine/faults.py), not here.
"""
from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from engine.runner import decode_graph
from engine.runner.decode_graph import DecodeGraphs
from engine.runner.mixed_graph import TILES, MixedGraphs
from engine.runner.ahead import Ahead, EagerRounds
from engine.config import SHORT_ROWS, ConfigError, EngineConfig, ModelConfig
from engine.cpu.kernels import CpuKernels
from engine.cpu.cut_attention import tile_for
from engine.cpu.packed import bf16_refused
from engine.runner.kv_cache import KVCache
from engine.scheduler.backend import Capabilities, next_cut
from engine.cpu.forward import CpuOps, mixed_products as cpu_mixed_products, round_products
from engine.cuda.forward import FusedOps, mixed_products, round_kernels
from engine.models.qwen3 import ForwardPlan, TorchOps, decode_attention_loop
from engine.models.presets import resolve_model
from engine.runner.sampler import choose
from engine.scheduler.sampling import SamplingParams
from engine.models.tokenizer import load_tokenizer
from engine.models.weights import DTYPES, load_model

log = logging.getLogger("engine.runner.model_runner")
# CUDA memory kept free beside the weights and the KV cache: a prompt cut's activations, scratch.
KV_HEADROOM = 4 << 30
# CUDA mixed forwards: a sized cut ends on a multiple of this many positions. Any would keep the bits
# (cut_flash's tiles sit at absolute positions, the cut's products run at a checked row count); cut_flash's
# query tile (CutFlashConfig.block_m), so that a cut fills whole tiles: its attention is paid a tile at a time.
MIXED_GRANULE = 128


def mixed_ids(cuts, first_logits: torch.Tensor, logits: torch.Tensor, where: list[int]) -> tuple[list[int | None], list[int]]:
    """A mixed forward's greedy answer: each cut's first token where it ends its prompt (else None),
    and the round's ids at its entries' rows."""
    firsts, out = first_logits.argmax(-1).tolist(), logits.argmax(-1).tolist()
    return [int(f) if e == len(t) else None for f, (_, t, _, e) in zip(firsts, cuts)], [out[row] for row in where]


def warm_cuts(rows: int, max_len: int, split: int | None) -> list[tuple[int, int]]:
    """The (rows, start) of the prompt cuts run at start-up so that Triton compiles before a request
    does: a full cut and a 17-row one (Triton compiles again for an int argument of 1, a multiple
    of 16 or neither), and with cut_flash's key splits one cut reading two splits, the first that
    launches the merge kernel (left to a request, a 32k prompt's third cut took 0.6 s, not 30 ms,
    in the first server on a machine)."""
    out = [(rows, 0), (17, rows)] if max_len >= rows + 17 else []
    if split is not None and split > rows and max_len >= split + 17:
        out.append((17, split))
    return out


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model=None):
        """`model`: reuse an already loaded (fused) model of the same shape (bench comparisons)."""
        self.cfg = cfg
        mcfg, name, model_dir = resolve_model(cfg.model)
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device} asked for, but torch {torch.__version__} sees no CUDA device")
        if not (cfg.device == "cpu" or cfg.device.startswith("cuda")):
            raise ConfigError(f"--device must be cpu or cuda, not {cfg.device!r}")
        if cfg.device == "cpu" and cfg.kernels.cpu_fast and (why := bf16_refused(cfg.dtype)):
            raise ConfigError(why)
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
        if self.device.type == "cuda":
            self._check_kv_fits(model.config)
        self.kv = KVCache(model.config, cfg.parallel, cfg.max_model_len, self.dtype, self.device)
        self.spare = self.kv.spare

        knobs = cfg.kernels
        self.fused = self.device.type == "cuda" and knobs.fused
        self.skinny = self.fused and knobs.skinny
        # CUDA: cuts of <= SHORT_ROWS rows through row-invariant matmuls, alone or several in one
        # forward (prefill_many): cuBLAS at the row counts checked bitwise here, else the tiles
        self._kernels = None  # engine.cuda.kernels.CudaKernels, made on first use (`kernels`)
        self.batch_cuts, self.batch_rows = self.fused and knobs.batch_cuts, ()
        if self.batch_cuts and knobs.batch_cublas:
            from engine.cuda.batch import adopt_buckets  # (CUDA only: the CPU runner never loads triton)
            a, m = model.model.layers[0].self_attn, model.model.layers[0].mlp
            self.kernels.batch = adopt_buckets([a.wqkv, a.o_proj.weight, m.w_gate_up, m.down_proj.weight])
            self.batch_rows = self.kernels.batch.rows
        # CPU: the kernels chosen once (engine/cpu/kernels.py): prepacked matmuls, the C decode attention,
        # the C++ round; KernelConfig(cpu_fast=False) keeps the plain reference ops. (A tensor-parallel
        # rank wraps _decode_body: its round stays in Python.)
        self.cpu: CpuKernels | None = None
        self.round_rows = cfg.parallel  # the padded shape: the most rows a decode round has
        if self.device.type == "cpu":
            self.cpu = CpuKernels(model, cfg, own_round=type(self)._decode_body is ModelRunner._decode_body)
            self.round_rows = self.cpu.round_rows
            self.batch_cuts = self.cpu.rows_free
        self.mix_floor = self.cpu.mix_floor if self.cpu is not None else None
        # whether a cut keeps its rows' bits wherever it starts and ends: the host may size it freely
        self.cut_free = self.mix_floor is not None and cfg.prefill_rows >= self.mix_floor
        # fp32 (and bf16 without cpu_rows_free) cut attention computes whole tiles: cut at their ends
        self.cut_granule = 16 if self.cpu is not None and self.cpu.rows_free else tile_for(cfg.prefill_rows)
        # CUDA mixed forwards as graphs (engine/runner/mixed_graph.py); cut_sizes: the cut rows the
        # host's budget picks among (None: any multiple of cut_granule)
        self.mixed_graphs: MixedGraphs | None = None
        self.cut_sizes: tuple[int, ...] | None = None
        if cfg.prefill_mode == "mixed" and self.device.type == "cuda":  # (_mixed_fused)
            if why := self._mixed_refused():
                raise ConfigError(why)
            self.cut_free, self.cut_granule = True, MIXED_GRANULE
            if cfg.tensor_parallel == 1:
                self.mixed_graphs = MixedGraphs(self, tiles=TILES if cfg.kernels.mixed_low_tiles else ())
                self.cut_sizes = self.mixed_graphs.sizes
        self.graphs = DecodeGraphs(self)  # the decode round's CUDA graphs (capture_graph)
        self.buckets: tuple[int, ...] = (self.round_rows,)  # the row counts rounds run at
        self.ahead: Ahead | None = None  # rounds launched one ahead (engine/runner/ahead.py)
        self.graph_fallback_reason: str | None = None
        self._cut_thread: ThreadPoolExecutor | None = None
        # --prefill-mode split: the decode and prompt SM partitions, the rounds captured on the
        # decode one, and the cut in flight on the prompt one (start_step)
        self.sm_split = None
        self.split_graphs: DecodeGraphs | None = None
        self._inflight: deque[Future] = deque()
        self._split_thread: ThreadPoolExecutor | None = None  # launches those cuts (start_step)
        if self.device.type == "cuda":
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
        elif knobs.cuda_graph:
            self.capture_graph()  # falls back: records why
        self._eager: EagerRounds | None = None
        if self.device.type != "cuda":
            self.buckets = decode_graph.buckets(self)
            if decode_graph.overlaps(self):
                self._eager = e = EagerRounds(lambda inp, rows: self._decode_body(inp, rows), self.spare, self.device)
                self.ahead = Ahead(e.fresh, e.chained, self.spare, self.max_model_len, self.round_rows, self.device)

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
        the adopted batch buckets, the ring's state); made on first use, so a CPU runner that never
        runs the fused kernels never loads triton."""
        if self._kernels is None:
            from engine.cuda.kernels import CudaKernels
            tiles = None
            # cut_tiles: not for a float32 CUDA runner (a reference: its halves are plain math, where
            # the tiles' float32 dots would run in tf32)
            if self.cfg.kernels.cut_tiles and not (self.device.type == "cuda" and self.dtype == torch.float32):
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
            logits = self.in_cut_thread(self._forward_cut, ids, lane, start)  # CUDA: where cuDNN's graphs were built
            tok = int(logits.argmax(-1).item()) if end == n else None
        if end == n:
            if sampling is None or sampling.plain:
                return tok
            return choose(logits.reshape(1, -1), [tok], [sampling], [n], logprobs)[0]
        if self.device.type == "cuda":
            # The host times each step to charge the decoders' share: a step must not return
            # while its kernels are still queued, or the next decode round pays for it. In split mode
            # its own stream only: a cut may be running beside it on the prompt partition.
            if self.sm_split is None:
                torch.cuda.synchronize(self.device)
            else:
                torch.cuda.current_stream(self.device).synchronize()
        return None

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
                # that wait held the host's next round for the whole cut (an 81 ms pause, H100). Wait
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

    def _check_cut(self, lane: int, n: int, start: int, end: int) -> None:
        if not (0 <= lane < self.parallel):
            raise ValueError(f"lane {lane} outside 0..{self.parallel - 1}")
        if not (0 <= start < end <= n):
            raise ValueError(f"bad cut [{start}, {end}) of a {n}-token prompt")
        if end > self.max_model_len:
            raise ValueError(f"prompt of {n} tokens exceeds max_model_len {self.max_model_len}")

    @torch.inference_mode()
    def prefill_many(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[int | None]:
        """Several prompt cuts [(lane, tokens, start, end)], one per lane. CUDA: cuts of at most
        SHORT_ROWS rows go in one forward through row-invariant matmuls (engine/cuda/batch.py),
        so each cut's bits equal its bits alone; otherwise one after another. Returns per cut the
        greedy first token if it ends its prompt, else None."""
        if not (self.batch_cuts and all(e - s <= SHORT_ROWS for _, _, s, e in items)):
            return [self.prefill_step(*it) for it in items]
        if len({it[0] for it in items}) < len(items):
            raise ValueError("two cuts of one lane in one forward")
        for lane, tokens, start, end in items:
            self._check_cut(lane, len(tokens), start, end)
        return self._many(items)[0]

    def _many(self, items) -> list[int | None]:
        seqs = [(torch.tensor(list(t[s:e]), dtype=torch.long, device=self.device), lane, s) for lane, t, s, e in items]
        logits = self.in_cut_thread(self._forward_many, seqs)
        firsts = logits.argmax(-1).tolist()  # the one sync: the cuts' work is done when it returns
        return [int(f) if e == len(t) else None for f, (_, t, _, e) in zip(firsts, items)], logits

    @torch.inference_mode()
    def _forward_many(self, seqs) -> torch.Tensor:
        """Cuts [(tokens, lane, start)] in one forward, each cut's bits its own: its last row's logits."""
        if self.cpu is not None and self.cpu.packed is not None and not self.fused:  # (cpu.rows_free)
            return self._forward_cpu(ForwardPlan.of(seqs), pad=False)
        # rows up to a count every product was checked at (engine/cuda/batch.py Buckets): padding rows
        k, m = self.kernels, sum(t.shape[0] for t, _, _ in seqs)
        plan = ForwardPlan.of(seqs, pad=k.batch.padded_rows(m) - m, spare=self.spare)
        h = self.model(plan, FusedOps(self.model, self.kv, plan, self._launch(), mm=k.matmul))
        return k.matmul(h[plan.last_rows()], self.model.lm_head.weight)

    @torch.inference_mode()
    def _forward_cut(self, ids: torch.Tensor, lane: int, start: int) -> torch.Tensor:
        """One cut's last row's logits."""
        plan = ForwardPlan.cut(ids, lane, start)
        if self.cpu is not None and self.cpu.packed is not None and not self.fused:  # (a check may turn fused on in the interpreter)
            return self._forward_cpu(plan, pad=not self.cpu.rows_free)[0]
        return self.model.lm_head(self.model(plan, self._cut_ops(plan))[-1])

    def _cut_ops(self, plan: ForwardPlan):
        """A prompt cut's kernels off the CPU's fast path: the fused ones, or plain torch (the cut
        attention through cuDNN's halves on CUDA)."""
        if self.fused:
            return FusedOps(self.model, self.kv, plan, self._launch())
        return TorchOps(self.model, self.kv, plan)

    def _forward_cpu(self, plan: ForwardPlan, pad: bool) -> torch.Tensor:
        """Prompt cuts on the CPU kernels (engine/cpu/forward.py): each cut's last row's logits."""
        packed = self.cpu.packed
        h = self.model(plan, CpuOps(self.model, self.kv, plan, packed, packed.mm, self.cpu.cut_attention, pad))
        return packed.mm(h[plan.last_rows()], "lm_head")

    def cut_logits(self, ids: torch.Tensor, lane: int, start: int, fused: bool = False) -> torch.Tensor:
        """Every row's logits of one cut through plain torch (the reference), or with `fused` this
        runner's fused kernels (tests, device checks)."""
        plan = ForwardPlan.cut(ids, lane, start)
        with torch.inference_mode():
            ops = FusedOps(self.model, self.kv, plan, self._launch()) if fused else TorchOps(self.model, self.kv, plan)
            return self.model.lm_head(self.model(plan, ops))

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
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return built

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
        gives them and each decode row with the bits `decode` gives it (the CPU's fast path:
        engine/cpu/forward.py mixed_products; CUDA with cut_flash: _mixed_fused; elsewhere the cuts, then the round). Returns (per cut its
        greedy first token if it ends its prompt, else None; the round's ids)."""
        if not (len(lanes) == len(tokens) == len(positions)) or not lanes:
            raise ValueError("a mixed forward needs decode entries, lanes, tokens and positions alike")
        if self.fused and self.kernels.cut_flash is not None:
            return self._mixed_fused(cuts, lanes, tokens, positions)
        if self.cpu is None or self.cpu.packed is None or self.fused or self.cpu.round is None:
            return [self.prefill_step(*c) for c in cuts], self.decode(lanes, tokens, positions)
        self._check_mixed(cuts, lanes)
        rows, where = self.padded_round(lanes, tokens, positions)
        if self.ahead is not None:
            self.ahead.drop()
        seqs = [(torch.tensor(list(t[s:e]), dtype=torch.long, device=self.device), lane, s) for lane, t, s, e in cuts]
        plan = ForwardPlan.of(seqs, torch.tensor(rows, dtype=torch.long, device=self.device))
        n, cpu = plan.n, self.cpu
        # each cut's rows as prefill_step gives them, the round's as decode does (engine/cpu/forward.py)
        grid = [s % self.prefill_rows == 0 and e == next_cut(s, len(t), self.prefill_rows) for _, t, s, e in cuts]
        attend = cpu.round_attention(self.kv, plan.lanes[n:], plan.positions[n:], list(zip(rows[2], rows[1])),
                                     self.spare, self.max_model_len)  # (the C kernel the C++ round calls)
        ops = CpuOps(self.model, self.kv, plan, cpu.packed, cpu_mixed_products(cpu.packed, plan, cpu.mix_floor, grid),
                     cpu.cut_attention, pad=not cpu.rows_free, round_attention=attend)
        h = self.model(plan, ops)
        firsts = torch.cat([cpu.packed.mm(h[[r]], "lm_head") for r in plan.last_rows()])  # each alone, as prefill_step's
        return mixed_ids(cuts, firsts, cpu.packed.mm_tiled(h[n:], "lm_head"), where)

    def _mixed_refused(self) -> str | None:
        """Why this CUDA runner's mixed forwards could not keep every row's bits, or None."""
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
        """`mixed` on CUDA: the cuts' products through the prompt cuts' row-invariant product (cuBLAS
        at the checked counts), the round's through its own kernels at its row count, so each row
        keeps the bits its own call gives it. here: in the calling thread (the cut thread's own
        warm-up), else in the cut thread, as prompt cuts run."""
        self._check_mixed(cuts, lanes)
        rows, where = self.padded_round(lanes, tokens, positions)
        if self.ahead is not None:
            self.ahead.drop()
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

    def _check_mixed(self, cuts, lanes) -> None:
        taken = set(lanes)
        for lane, toks, start, end in cuts:
            self._check_cut(lane, len(toks), start, end)
            if lane in taken:
                raise ValueError(f"lane {lane} twice in one mixed forward")
            taken.add(lane)

    # ---- decode rounds -----------------------------------------------------------------------
    def in_cut_thread(self, fn, *args):
        """fn(*args) where prompt cuts run: the cut thread on CUDA (its graphs and cuDNN's were built
        there), else here."""
        return fn(*args) if self._cut_thread is None else self._cut_thread.submit(fn, *args).result()

    def padded_round(self, lanes, tokens, positions) -> tuple[list[list[int]], list[int]]:
        """[tokens, positions, lanes] of the round's row count (the fewest of `buckets` holding its
        highest lane and all its entries), and the row each entry went to. A lane's first entry
        sits in row `lane`, as in every plain round; further entries of the same lane (a
        drafter's tokens to verify, at the next positions) take rows no lane of this round owns.
        Every row writes its K/V before any row attends, so a draft row sees the rows before it
        exactly as a later plain round would."""
        if len(lanes) > self.round_rows:
            raise ValueError(f"{len(lanes)} rows in one decode round; the round has {self.round_rows}")
        need = max(len(lanes), max(lanes) + 1)
        p = next((n for n in self.buckets if n >= need), self.round_rows)
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

    def round_logits(self, inp: torch.Tensor, mode) -> torch.Tensor:
        """A decode round's logits from inp [tokens, positions, lanes, ...] on the device, its kernels
        launched in `mode` (engine/cuda/launch.py LaunchMode): what the decode graphs capture."""
        return self._decode_body(inp, mode=mode)

    def _decode_body(self, inp: torch.Tensor, rows=None, mode=None) -> torch.Tensor:
        """The round's logits [parallel, vocab]; mode: the CUDA kernels' launch mode (None: plain);
        rows: the round's (lane, position) pairs as Python ints, where the attention wants them."""
        plan, kv = ForwardPlan.round(inp[0], inp[1], inp[2]), self.kv
        if self.cpu is not None and self.cpu.packed is not None and not self.fused:  # (a check may turn fused on in the interpreter)
            return self._decode_cpu(plan, rows)
        if self.device.type == "cuda":
            attend = None  # the launch's decode attention
        else:  # (the interpreter's checks, and the plain CPU reference)
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

    def _decode_cpu(self, plan: ForwardPlan, rows) -> torch.Tensor:
        """A round on the CPU kernels: its products in whole tiles, its attention the C kernel's (the
        C++ round's) or the batched matmuls'."""
        cpu, kv = self.cpu, self.kv
        live = (plan.lanes != kv.spare).nonzero().flatten()  # the padding rows write the spare lane
        attend = cpu.round_attention(kv, plan.lanes, plan.positions, rows, self.spare, self.max_model_len)
        ops = CpuOps(self.model, kv, plan, cpu.packed, round_products(cpu.packed, live), cpu.cut_attention,
                     round_attention=attend)
        return cpu.packed.mm_tiled(self.model(plan, ops), "lm_head", live)

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
        if self._inflight and self._graph_takes(lanes) and (self.ahead is None or self.ahead.pending is None):
            # a split's cut runs on the prompt partition: the round on the decode partition's SMs
            with torch.cuda.stream(self.sm_split.decode):
                out = self.split_graphs.fresh(rows).tolist()
            logits = self.split_graphs.rounds[len(rows[0])].s_logits
        elif self.ahead is not None and (self.graph is None or self._graph_takes(lanes)):
            out = self.ahead.round(rows, ahead and len(set(lanes)) == len(lanes), greedy)  # engine/runner/ahead.py
            logits = self._eager.logits if self._eager is not None else self.graphs.rounds[len(rows[0])].s_logits
        elif self._graph_takes(lanes):
            out = self.graphs.fresh(rows).tolist()
            logits = self.graphs.rounds[len(rows[0])].s_logits
        elif self.cpu is not None and self.cpu.round is not None and self.cpu.round.ready and not self.fused:
            logits, ids_t = self.cpu.round.rows(rows, self.spare, self.kv)  # the same bits as below
            out = ids_t.tolist()
        else:
            if self.ahead is not None:
                self.ahead.drop()  # (a round of several rows a lane: see _graph_takes)
            inp = torch.tensor(rows, dtype=torch.long, device=self.device)
            logits = self._decode_body(inp, rows=list(zip(rows[2], rows[1])))
            out = logits.argmax(-1).tolist()
        ids = [out[row] for row in where]
        if greedy:
            return ids
        # the new token of an entry fed at position q sits at q + 1
        return choose(logits[where], ids, sampling, [q + 1 for q in positions], logprobs)

    def _graph_takes(self, lanes: Sequence[int]) -> bool:
        """Whether a round of these lanes replays the graph: not where a lane has several rows and
        the graph has the q/k fold (eager rounds run the unfolded kernels: the same bits)."""
        return self.graph is not None and not (self.graphs.qk_fold and len(set(lanes)) < len(lanes))

    def capture_graph(self) -> bool:
        """Capture the decode round at each of its row counts (engine/runner/decode_graph.py); on CPU (or
        failure) fall back to eager rounds and say why. Returns whether a graph is in use."""
        ok = self.graphs.capture()
        self.buckets, self.ahead = self.graphs.rows, self.graphs.ahead
        self.graph_fallback_reason = self.graphs.fallback_reason
        return ok

    @property
    def runs_ahead(self) -> bool:
        """Whether decode(..., ahead=True) launches the next round before returning (engine/runner/ahead.py)."""
        return self.ahead is not None

    @property
    def caps(self) -> Capabilities:
        """What the lane host may ask of this runner (backend.Capabilities), from what it set up."""
        return Capabilities(cut_granule=self.cut_granule, cut_sizes=self.cut_sizes, cut_free=self.cut_free,
                            batch_cuts=self.batch_cuts, runs_ahead=self.runs_ahead, mixed=True,
                            split=self.sm_split is not None)

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


def _on_device(device: torch.device) -> None:
    """A thread's CUDA device, where the runner names one (Triton launches on the current device)."""
    if device.index is not None:
        torch.cuda.set_device(device)


def build_runner(cfg: EngineConfig) -> ModelRunner:
    return ModelRunner(cfg)
