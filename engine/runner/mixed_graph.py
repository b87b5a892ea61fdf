"""Mixed forwards (one prompt cut and a decode round in one forward) as CUDA graphs at fixed shapes.

Launched eagerly, a mixed forward of qwen3-8b is ~900 kernel launches from Python, 35-90 ms
whatever its cut, where its kernels take 4-25 ms; a graph replays them in one launch.

- Shapes: a cut capacity from SIZES (up to --prefill-rows) times each decode row count of the
  runner (`buckets`). A cut of T rows runs in the smallest capacity >= T; its rows past T are
  padding (token 0, the spare lane, positions 0, 1, ...), which no real row reads: the products
  are row-invariant and the cut's attention stops at the cut's rows (cut_flash.cut_attention_at
  reads the cut's start, rows and lane from the device).
- Products (`plan_products`): at each shape, each weight runs as one cuBLAS launch over the cut's
  and the round's rows, padded with zero rows to the fewest count where a start-up check found
  that this gives the cut's rows the bits of the prompt cuts' row-invariant product and the round's
  rows those of the round's own kernels; else as two launches, one for each kind of row (the cut's
  through cuBLAS at the fewest rows giving it its bits). An output element summed over K in one
  float32 chain from 0 has the same bits in every kernel that walks it so (cuBLAS where it does not
  split K, the skinny kernels, the TMA ring, the batch tiles: tools/down_probe.py), which is why the
  round's products sum K in one chain. On the H200 every qwen3-8b product runs as one launch; down
  is padded (cuBLAS splits it below 192 rows, and between 192 and 264 gives a row the grid's bits
  only at 192 and 248), and reads silu * up from the head of its padded buffer, which act writes
  (`products` down=): 0.19-0.24 ms less a 128-row forward than a fill and a copy a layer. Padding the
  whole forward to down's count instead made gate/up 0.6 ms slower (cuBLAS's kernel at 192 rows).
  Where one launch needs padding, the weight's N rows in 2, 4 or 8 strided-batched chunks are checked
  too (`chunked`: no element's K chain moves, cuBLAS picks another kernel), and the faster form kept.
- Inputs: [3, c] int64 (tokens, positions, lanes: the cut's rows, then the round's) and the cut's
  int32 [start, rows, lane], pinned on the host and copied in by the graph's first nodes.
- Outputs: the round's greedy ids and the hidden state of the cut's last row; where the cut ends
  its prompt, the runner takes its first token from that row as `prefill_step` would.

`forward` is the captured body; it also runs eagerly (the CPU tests run it under Triton's
interpreter against the eager mixed forward, bit for bit).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.cuda.forward import FusedOps, round_kernels
from engine.models.qwen3 import ForwardPlan

if TYPE_CHECKING:  # cut_flash loads triton, which a CPU runner never needs
    from engine.cuda.cut_flash import CutFlashConfig

log = logging.getLogger("engine.runner.model_runner")

# cut capacities: the budget picks among these (ForwardCost sizes), so a sized cut fills its graph.
# Multiples of cut_flash's 128-row query tile, so that cuts starting on one end on one: on the H200
# a 64-row cut cost what a 128-row one does (7.2 against 7.4 ms at 0 keys, 8.9 against 9.0 at 8,192:
# the same tile a head, the same padded products), and a 192-row cut would leave every cut after it
# across one more tile.
SIZES = (128, 256, 384, 512, 768, 1024)
# The cut attention's lower tiles (CutFlashConfig fields over the runner's), for MixedGraphs(tiles=TILES)
# to check and time against the runner's at capacities up to SMALL_CUT: a 128-row cut runs one 128-row
# tile a head and key split (32 x 5 programs at 8,192-10,239 keys on qwen3-8b), which fills the H200's
# 132 SMs in uneven waves; 64-row tiles double the programs. The runner plans none (tiles=()): what they
# save is tools/mixed_forms.py's 'tiles' form to measure, side by side with the runner's.
SMALL_CUT = 256
TILES = ({"block_m": 64, "warps": 4}, {"block_m": 64, "warps": 8})


def sizes_for(prefill_rows: int, max_model_len: int) -> tuple[int, ...]:
    """The capacities a runner captures: SIZES up to --prefill-rows (which a cut never exceeds),
    that one included, none past the lane's length."""
    top = min(prefill_rows, max_model_len)
    return tuple(sorted({s for s in SIZES if s < top} | {top}))


@dataclass
class MixedShape:
    """One shape's graph and static buffers."""
    rows: int  # the cut's capacity
    round_rows: int
    h_in: torch.Tensor  # [3, rows + round_rows] int64, pinned
    s_in: torch.Tensor
    h_meta: torch.Tensor  # [3] int32 (start, rows, lane), pinned
    s_meta: torch.Tensor
    plan: dict  # weight shape (N, K) -> Product (plan_products)
    tiles: CutFlashConfig | None = None  # the cut attention's config at this capacity (cut_flash.plan_tiles)
    graph: torch.cuda.CUDAGraph | None = None
    s_last: torch.Tensor | None = None  # the cut's last row's hidden state [hidden]
    s_ids: torch.Tensor | None = None  # the round's ids [round_rows]


@dataclass(frozen=True)
class Product:
    """How one weight runs at a shape (plan_products): `both`, one launch over the cut's rows and the
    round's, padded with zero rows to `rows` (F.linear, or `chunks` > 1: the weight's N rows as that many
    strided-batched chunks, `chunked`); else two launches, the cut's rows through F.linear at `rows`
    (zeros below them; None: cut_mm itself) and the round's through the round's own kernels."""
    both: bool
    rows: int | None
    chunks: int = 1


def chunked(x: torch.Tensor, w: torch.Tensor, chunks: int = 1) -> torch.Tensor:
    """x @ w.T with w's N rows as `chunks` strided-batched products (x broadcast to each), set side by
    side. No element's sum over K moves (each output column is still one chain), only cuBLAS's choice of
    kernel: on the H200 qwen3-8b's down gives a row its grid bits in 4 chunks at 136 rows in 1.56 ms
    (36 layers) where one launch needs 192 rows and 1.81 ms (tools/chunk_probe.py)."""
    if chunks == 1:
        return F.linear(x, w)
    n_out, k = w.shape
    y = torch.bmm(x.expand(chunks, *x.shape), w.view(chunks, n_out // chunks, k).transpose(1, 2))
    return y.transpose(0, 1).reshape(x.shape[0], n_out)


def fewest_rows(w: torch.Tensor, cases: list, top: int = 1024, act=None, chunks: int = 1) -> int | None:
    """The fewest rows m (the cases' own count, else a multiple of 8 up to `top`) at which one launch
    (`chunked` in `chunks`) over each case's rows x and m - len(x) rows of zeros gives them `want`'s bits
    (act applied to the product first); None if none does. cases: [(x, want)], all of one row count."""
    n, post = cases[0][0].shape[0], act or (lambda y: y)
    for m in dict.fromkeys([n, *range(-(-n // 8) * 8, top + 1, 8)]):
        if all(torch.equal(post(chunked(pad(x, m), w, chunks)[:n]), want) for x, want in cases):
            return m
    return None


def random_rows(w: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=w.device).manual_seed(seed)
    return torch.randn(n, w.shape[1], generator=g, device=w.device).to(w.dtype)


def one_launch_cases(w: torch.Tensor, n: int, p: int, cut_mm, round_mm, act=None, seeds=(0, 1)) -> list:
    """[(x, want)] on random rows: n cut rows and p round rows, want the first n cut_mm's bits and the
    next p round_mm's (act: the gate/up activation, applied to cut_mm's product; round_mm then is the
    round's fused gate/up kernel)."""
    cases = []
    for seed in seeds:
        x = random_rows(w, n + p, seed)
        cut = cut_mm(x[:n], w)
        cases.append((x, torch.cat([act(cut) if act is not None else cut, round_mm(x[n:], w)])))
    return cases


def event_ms(run, reps: int = 5) -> float:
    """Median ms of `run()` on the device by CUDA events, over `reps` calls after an untimed one (which
    compiles or warms the library's choice)."""
    times = []
    for i in range(reps + 1):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        if i:
            times.append(e0.elapsed_time(e1))
    return sorted(times)[len(times) // 2]


def launch_ms(layers: list, rows: int, chunks: int, reps: int = 5) -> float:
    """Median ms of one launch (`chunked`) over `rows` random rows for each of the layers' weights, on
    the device (layers of the model's size, so that L2 holds none of them, as in a forward)."""
    x = random_rows(layers[0], rows, 9)
    return event_ms(lambda: [chunked(x, w, chunks) for w in layers], reps)


def plan_products(weights: dict, n: int, p: int, cut_mm, launch, skinny: bool, chunks=(2, 4, 8)) -> dict:
    """(N, K) -> Product for each of the layer's weights {name: [w of each layer]} at a shape of n cut rows
    and p round rows: one launch over both kinds at the fewest rows where a bitwise check gives each
    kind its bits, else two launches (padded_count for the cut's rows). cuBLAS splits K at some row
    counts, and a split sums in another order: on the H200 qwen3-8b's down gave a row the grid cut's
    bits only at 192, 248 and from 264 rows. Where one F.linear needs padding, the weight in `chunks`
    (`chunked`) is checked too, and the faster form taken: timed on the device over every layer's
    weight (cuBLAS's kernel at a count is not foreseeable: on the H200 4 chunks ran qwen3-8b's down
    fastest, 2 qwen3-32b's, and one launch qwen3-32b's o padded by 8 rows), the fewest rows elsewhere."""
    round_mm, round_act = round_kernels(launch, skinny)
    out = {}
    for name, layers in weights.items():
        w = layers[0]
        act = launch.silu_mul if name == "gate_up" else None
        cases = one_launch_cases(w, n, p, cut_mm, round_act if act is not None else round_mm, act=act)
        m = fewest_rows(w, cases, act=act)
        if m is None:
            out[tuple(w.shape)] = Product(False, padded_count(w, n, cut_mm))
            continue
        forms = [Product(True, m)]
        if m > n + p:
            forms += [Product(True, mc, c) for c in chunks if w.shape[0] % c == 0
                      for mc in [fewest_rows(w, cases, top=m - 8, act=act, chunks=c)] if mc is not None]
        if len(forms) > 1 and w.is_cuda:
            out[tuple(w.shape)] = min(forms, key=lambda f: launch_ms(layers, f.rows, f.chunks))
        else:
            out[tuple(w.shape)] = min(forms, key=lambda f: (f.rows, f.chunks))
    return out


def padded_count(w: torch.Tensor, n: int, cut_mm, seeds=(0, 1)) -> int | None:
    """The fewest rows (fewest_rows) at which F.linear over n rows and zeros gives them cut_mm's bits,
    on random rows."""
    return fewest_rows(w, [(x, cut_mm(x, w)) for x in (random_rows(w, n, 100 + s) for s in seeds)])


def pad(x: torch.Tensor, m: int) -> torch.Tensor:
    """x with zero rows below it up to m rows."""
    return x if m == x.shape[0] else torch.cat([x, x.new_zeros(m - x.shape[0], x.shape[1])])


def products(plan: dict, n: int, cut_mm, launch, skinny: bool, down: tuple | None = None):
    """The forward's mm and act (engine/cuda/forward.py FusedOps) for a shape: each weight as `plan` says (plan_products). down: the down
    weight's (N, K), when act's silu * up is to be written into the head of down's padded input (a
    buffer whose padding rows are zeroed once a forward), so that down reads it without a fill and a
    copy each layer; None: down pads its input as any product does."""
    round_mm, round_act = round_kernels(launch, skinny)
    to = plan.get(down)
    held = []  # down's padded input, made at the first layer

    def planned(x, w, post, rnd):
        how = plan[tuple(w.shape)]
        if how.both:
            return post(chunked(pad(x, how.rows), w, how.chunks)[:x.shape[0]])
        cut = cut_mm(x[:n], w) if how.rows is None else F.linear(pad(x[:n], how.rows), w)[:n]
        return torch.cat([post(cut), rnd(x[n:], w)])

    def mm(x, w):
        if held and x.data_ptr() == held[0].data_ptr():  # act's output, the head of down's padded input
            return chunked(held[0], w, to.chunks)[:x.shape[0]]
        return planned(x, w, lambda y: y, round_mm)

    def act(x, w):
        how, rows = plan[tuple(w.shape)], x.shape[0]
        if not (how.both and to is not None and to.both and to.rows > rows):
            return planned(x, w, launch.silu_mul, round_act)
        gu = chunked(pad(x, how.rows), w, how.chunks)[:rows]
        if not held:
            held.append(gu.new_zeros(to.rows, gu.shape[1] // 2))
        return launch.silu_mul(gu, out=held[0][:rows])
    return mm, act


def forward(model, kv, inp: torch.Tensor, meta: torch.Tensor, n: int, plan: dict, cut_mm, launch, tiles,
            max_len: int, skinny: bool, hold_down: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixed forward at a shape: inp [3, n + p] (tokens, positions, lanes), the cut's rows first;
    meta int32 [start, rows, lane]. Returns (the cut's last row's hidden state, the round's ids)."""
    from engine.cuda.cut_flash import cut_attention_at
    mm, act = products(plan, n, cut_mm, launch, skinny, down=tuple(model.model.layers[0].mlp.down_proj.weight.shape)
                       if hold_down else None)
    # the cut's rows [0, n) (its padding rows in the spare lane) attend in one call, at the cut's start
    rows = ForwardPlan(inp[0], inp[1], inp[2], n=n)
    ops = FusedOps(model, kv, rows, launch, mm=mm, act=act,
                   cut_rows=lambda i, q: cut_attention_at(q, kv.k[i], kv.v[i], meta, max_len, tiles))
    h = model(rows, ops)
    last = h.index_select(0, (meta[1:2] - 1).long())[0]
    logits = (launch.linear if skinny else F.linear)(h[n:], model.lm_head.weight)
    return last, launch.argmax_rows(logits)


class MixedGraphs:
    """A runner's mixed-forward graphs: `capture` at start-up (in the cut thread), `run` per forward.
    What it reads of the runner: model, kv, kernels, spare, max_model_len, prefill_rows, buckets,
    skinny, device, _launch."""

    def __init__(self, runner, hold_down: bool = True, chunks: tuple = (2, 4, 8), tiles: tuple = (),
                 base_fields: dict | None = None):
        """hold_down: down reads silu * up from its padded buffer (products); off, it pads its input as
        the other products do (the same bits: tools/mixed_forms.py times both side by side). The round's
        kernels launch plainly: with the decode graph's PDL and folded combine every shape measured
        4-5 % slower on the H200 (receipts/mixed-products/20261203-0920-h200-mixed-forms.json)."""
        self.runner = runner
        self.hold_down = hold_down
        self.chunks = chunks  # plan_products' chunk counts (() for one F.linear launch a product)
        # the cut attention's other tile shapes (CutFlashConfig fields over the runner's) to check and time
        # at each capacity up to SMALL_CUT on CUDA (plan_tiles); (): the runner's own everywhere
        self.tiles = tiles
        # CutFlashConfig fields over the runner's that every capacity starts from (tools/mixed_forms.py's
        # forms of one kernel's bits side by side); None: the runner's
        self.base_fields = base_fields or {}
        self._tile_plan: dict[int, CutFlashConfig | None] = {}
        self.sizes = sizes_for(runner.prefill_rows, runner.max_model_len)
        self.shapes: dict[tuple[int, int], MixedShape] = {}
        self.fallback_reason: str | None = "not captured"

    def _weights(self) -> dict:
        """Each product's weight in every layer (plan_products checks bits on the first, times on all)."""
        layers = self.runner.model.model.layers
        return {"qkv": [l.self_attn.wqkv for l in layers], "o": [l.self_attn.o_proj.weight for l in layers],
                "gate_up": [l.mlp.w_gate_up for l in layers], "down": [l.mlp.down_proj.weight for l in layers]}

    def shape(self, n: int, p: int) -> MixedShape:
        r = self.runner
        pin = (lambda t: t.pin_memory()) if r.device.type == "cuda" else (lambda t: t)

        def pair(*size, dtype):
            return pin(torch.zeros(*size, dtype=dtype)), torch.zeros(*size, dtype=dtype, device=r.device)
        return MixedShape(n, p, *pair(3, n + p, dtype=torch.long), *pair(3, dtype=torch.int32),
                          plan_products(self._weights(), n, p, r.kernels.matmul, r._launch(), r.skinny,
                                        self.chunks), self.tiles_at(n))

    def tiles_at(self, n: int) -> CutFlashConfig | None:
        """The cut attention's config at a capacity of n rows (one plan a capacity, every round's)."""
        r = self.runner
        if r.kernels.cut_flash is None:
            return None
        base = replace(r.kernels.cut_flash, **self.base_fields)
        if n not in self._tile_plan:
            fields = self.tiles if n <= SMALL_CUT else ()
            m = r.model_config
            from engine.cuda.cut_flash import plan_tiles
            timer = (lambda c, run: event_ms(run)) if r.device.type == "cuda" else None
            self._tile_plan[n] = plan_tiles(base, [replace(base, **f) for f in fields], n, r.max_model_len,
                                            m.num_attention_heads, m.num_key_value_heads, m.head_dim, r.device,
                                            r.dtype, timer) if fields else base
        return self._tile_plan[n]

    def body(self, s: MixedShape):
        r = self.runner
        return forward(r.model, r.kv, s.s_in, s.s_meta, s.rows, s.plan, r.kernels.matmul, r._launch(),
                       s.tiles, r.max_model_len, r.skinny, self.hold_down)

    def fill(self, s: MixedShape, lane: int, toks, start: int, rows: list[list[int]]) -> None:
        """The pinned inputs for a cut of `toks` at `start` of `lane` and the padded round `rows`."""
        t, n, spare = len(toks), s.rows, self.runner.spare
        h = s.h_in.numpy()
        h[0, :t], h[0, t:n] = toks, 0
        h[1, :t], h[1, t:n] = range(start, start + t), range(n - t)
        h[2, :t], h[2, t:n] = lane, spare
        h[:, n:] = rows
        s.h_meta.numpy()[:] = (start, t, lane)

    def capture(self) -> bool:
        """Every shape's graph (in one memory pool: they never run at once); False, with
        `fallback_reason`, where capture fails (mixed forwards then run eagerly)."""
        r = self.runner
        try:
            pool = torch.cuda.graph_pool_handle()
            for p in r.buckets:
                for n in self.sizes:
                    s = self.shape(n, p)
                    s.h_in[2] = s.s_in[2] = r.spare  # warm-up and capture write the spare lane only
                    s.h_meta[:] = s.s_meta[:] = torch.tensor([0, 1, r.spare], dtype=torch.int32)
                    self.body(s)  # compiles, and sizes the kernels' scratch outside the capture
                    torch.cuda.synchronize(r.device)
                    s.graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(s.graph, pool=pool, capture_error_mode="thread_local"):
                        s.s_in.copy_(s.h_in, non_blocking=True)
                        s.s_meta.copy_(s.h_meta, non_blocking=True)
                        s.s_last, s.s_ids = self.body(s)
                    self.shapes[(n, p)] = s
            torch.cuda.synchronize(r.device)
            log.info("mixed graphs: %s", self.describe())
            self.fallback_reason = None
            return True
        except Exception as e:  # pragma: no cover - depends on the device
            self.shapes = {}
            self.fallback_reason = f"mixed graph capture failed ({e!r}): eager mixed forwards"
            log.warning(self.fallback_reason)
            return False

    def describe(self) -> str:
        """The shapes and their products' plans, in a line (/v1/engine)."""
        plans = [v for s in self.shapes.values() for v in s.plan.values()]
        padded = sorted({(s.rows + s.round_rows, v.rows) for s in self.shapes.values() for v in s.plan.values()
                         if v.both and v.rows != s.rows + s.round_rows})
        twice = sorted({(s.rows, v.rows) for s in self.shapes.values() for v in s.plan.values() if not v.both})
        split = sorted({(s.rows + s.round_rows, v.chunks) for s in self.shapes.values() for v in s.plan.values()
                        if v.both and v.chunks > 1})
        tiles = sorted({(s.rows, s.tiles.block_m, s.tiles.warps, s.tiles.tma) for s in self.shapes.values()
                        if s.tiles is not None and s.tiles != self.runner.kernels.cut_flash})
        return (f"CUDA graphs at cuts of {', '.join(map(str, self.sizes))} rows beside rounds of "
                f"{', '.join(map(str, sorted({p for _, p in self.shapes})))}; {sum(v.both for v in plans)} of "
                f"{len(plans)} products one cuBLAS launch over both kinds of rows (checked at start-up), padded "
                + (", ".join(f"{a}->{b}" for a, b in padded) or "nowhere")
                + ", in chunks of N " + (", ".join(f"{c} at {a}" for a, c in split) or "nowhere")
                + "; the rest one launch a kind, the cut's rows at "
                + (", ".join(f"{a}->{b if b is not None else 'the cuts product'}" for a, b in twice) or "-")
                + "; the cut attention in " + (", ".join(f"{m}-row tiles ({w} warps{', K and V by TMA' if t else ''}) at {n}"
                                                          for n, m, w, t in tiles)
                                               or "the runner's tiles everywhere") + " (checked at start-up)")

    def takes(self, cuts, p: int) -> MixedShape | None:
        """The shape that runs this forward (one cut that fits a capacity), or None (eager)."""
        if len(cuts) != 1 or not self.shapes:
            return None
        t = cuts[0][3] - cuts[0][2]
        n = next((n for n in self.sizes if n >= t), None)
        return None if n is None else self.shapes.get((n, p))

    def run(self, s: MixedShape, lane: int, toks, start: int, rows) -> tuple[torch.Tensor, list[int]]:
        """Replay s for the cut and round (without a graph, as the CPU tests do: run its body);
        (the cut's last hidden row, the round's ids by row)."""
        self.fill(s, lane, toks, start, rows)
        if s.graph is None:
            s.s_in.copy_(s.h_in)
            s.s_meta.copy_(s.h_meta)
            last, ids = self.body(s)
        else:
            s.graph.replay()
            last, ids = s.s_last, s.s_ids
        return last, ids.tolist()
