"""Decode rounds at fewer rows than the padded shape (engine/runner/decode_graph.py buckets): which row
counts a runner may use (every product routed as at the padded shape), and, on the CPU's eager
rounds, ids equal to rounds at the padded shape while streams join and leave, with and without
rounds run ahead."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")

import engine.cuda.skinny as S
from engine.runner import decode_graph
from engine.config import EngineConfig, KernelConfig
from engine.runner.build import build_runner

QWEN3_8B = {"wqkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
            "lm_head": (151936, 4096)}


def fake_runner(parallel, shapes=QWEN3_8B, row_buckets=None, ring=False):
    """What decode_graph.buckets reads of a CUDA runner: its knobs, its weights' shapes, its kernels'
    tables (the H200's) and whether its ring works."""
    w = {k: SimpleNamespace(shape=v) for k, v in shapes.items()}
    layer = SimpleNamespace(self_attn=SimpleNamespace(wqkv=w["wqkv"], o_proj=SimpleNamespace(weight=w["o"])),
                            mlp=SimpleNamespace(w_gate_up=w["gate_up"], down_proj=SimpleNamespace(weight=w["down"])))
    model = SimpleNamespace(model=SimpleNamespace(layers=[layer]), lm_head=SimpleNamespace(weight=w["lm_head"]))
    cfg = SimpleNamespace(kernels=KernelConfig(row_buckets=row_buckets), tensor_parallel=1)
    kernels = SimpleNamespace(skinny=S.H200, ring=SimpleNamespace(available=lambda: ring))
    return SimpleNamespace(round_rows=parallel, cfg=cfg, device=torch.device("cuda"), skinny=True, model=model,
                           kernels=kernels)


@pytest.mark.parametrize("ring", [False, True])
def test_row_counts_are_those_routed_as_the_padded_shape(ring):
    # 8 lanes: the ring (at most 8 rows) or the Triton tiles (padded to 16 rows) at every count
    assert decode_graph.buckets(fake_runner(8, ring=ring)) == (1, 2, 4, 8)
    # 16 lanes: 16 rows run the Triton kernels; 1-8 would run the ring, or the same Triton tiles
    assert decode_graph.buckets(fake_runner(16, ring=ring)) == ((16,) if ring else (1, 2, 4, 8, 16))
    # 32 lanes: q/k/v at 32 rows is cuBLAS's, whose kernel depends on the row count itself
    assert decode_graph.buckets(fake_runner(32, ring=ring)) == (32,)
    assert decode_graph.buckets(fake_runner(8, row_buckets=False, ring=ring)) == (8,)


@pytest.mark.parametrize("rows", [1, 8, 16, 32, 64])
@pytest.mark.parametrize("name", ["wqkv", "o", "gate_up", "down", "lm_head"])
def test_route_names_the_kernel_the_product_runs(monkeypatch, rows, name):
    """route() against the dispatch itself (linear / gate_up_silu, the ring off), on meta tensors."""
    ran = []
    monkeypatch.setattr(S, "_launch", lambda x, w, c, mode, out=None: ran.append(("skinny", c, S.block_m(x.shape[0]))))

    class Gated:
        def __getitem__(self, grid):
            return lambda x, w, *a, **kw: ran.append(("gated", S.H200.gated.get((w.shape[0], w.shape[1], kw["BLOCK_M"])),
                                                      kw["BLOCK_M"]))
    monkeypatch.setattr(S, "_gated_kernel", Gated())
    real_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w: ran.append(("cublas", x.shape[0])) or real_linear(x, w))
    monkeypatch.setattr(S, "silu_mul", lambda y, mode: ran.insert(0, ("silu",)))
    n, k = QWEN3_8B[name]
    x, w = torch.empty(rows, k, dtype=torch.bfloat16, device="meta"), torch.empty(n, k, dtype=torch.bfloat16, device="meta")
    gated = name == "gate_up"
    (S.gate_up_silu if gated else S.linear)(x, w, tables=S.H200)
    got = ran[0] if len(ran) == 1 else ran[0] + ran[1]
    assert got == S.route(n, k, rows, S.H200, gated, ring=False)


def test_a_64_row_round_runs_o_on_the_triton_tiles():
    """At 33-64 rows o takes Triton's 32x128 tiles (launched under PDL in the round), not cuBLAS: alone
    cuBLAS was 0.1 us faster, in the round Triton's 0.09 ms a round (qwen3-8b, H200);
    q/k/v and gate/up stay cuBLAS's, the ring (at most 8 rows) takes none of them."""
    o = ("skinny", S.SkinnyConfig(32, 128, 4, 6), 64)
    assert S.route(4096, 4096, 64, S.H200, ring=False) == o and S.route(4096, 4096, 40, S.H200, ring=True) == o
    assert S.route(6144, 4096, 64, S.H200, ring=True) == ("cublas", 64)
    assert S.route(24576, 4096, 64, S.H200, gated=True, ring=True) == ("silu", "cublas", 64)


def runner(row_buckets, overlap):
    return build_runner(EngineConfig(model="tiny", parallel=16, max_model_len=128, prefill_rows=16, seed=1,
                                     kernels=KernelConfig(row_buckets=row_buckets, overlap=overlap)))


def prompt(n, salt):
    return [(i * 37 + salt * 11 + 5) % 256 for i in range(n)]


@pytest.mark.parametrize("overlap", [False, True])
def test_rounds_at_fewer_rows_give_the_padded_shapes_ids(overlap):
    """Lanes 0 and 3 decode (8 rows on the CPU: one tile), lane 12 joins (16 rows), then ends."""
    got, widths = {}, {}
    for buckets in (True, False):
        r = runner(buckets, overlap)
        assert r.buckets == ((8, 16) if buckets else (16,))
        assert r.describe()["decode_rows"] == list(r.buckets)
        seen = []  # each round's row count
        padded = r.padded_round

        def record(*args):
            rows, where = padded(*args)
            seen.append(len(rows[0]))
            return rows, where
        r.padded_round = record
        lanes = [0, 3]
        toks = [r.prefill(ln, prompt(9 + ln, ln)) for ln in lanes]
        pos = [9 + ln for ln in lanes]
        log = []
        for k in range(12):
            if k == 4:
                lanes.append(12)
                toks.append(r.prefill(12, prompt(20, 12)))
                pos.append(20)
            if k == 8:
                del lanes[-1], toks[-1], pos[-1]
            out = r.decode(lanes, toks, pos, ahead=True)
            log.append(out)
            toks, pos = out, [p + 1 for p in pos]
        got[buckets], widths[buckets] = log, seen
        if overlap and buckets:
            # rounds 0-3 at 8 rows (1-3 taken ahead); 4 fresh at 16 (the round in flight at 8 wasted),
            # 5-7 taken; 8 served by the 16-row round in flight, but not chained (its rows are 16); 9
            # fresh at 8, 10-11 taken
            assert (r.ahead.taken, r.ahead.wasted) == (3 + 3 + 1 + 2, 1)
    assert got[True] == got[False]
    assert set(widths[False]) == {16}
    assert widths[True] == [8] * 4 + [16] * 4 + [8] * 4


def test_the_l2_prefetch_is_captured_only_into_rounds_of_few_rows(monkeypatch):
    """KernelConfig.prefetch_rows: each row count's graphs are captured with a launch mode whose L2
    prefetch (engine/cuda/prefetch.py) is on at most that many rows (one row gained, eight lost on
    qwen3-8b, H200), and the plain mode of eager calls keeps it off."""
    from dataclasses import replace
    from engine.cuda.launch import PLAIN
    r = fake_runner(8)
    g = decode_graph.DecodeGraphs(r)
    g.pdl, g.fold_combine, g.qk_fold = 3, True, True  # what capture() sets before the row counts
    on = {n: replace(g.mode_at(n), interpret=False).prefetch_on() for n in (1, 2, 8)}
    assert on == {1: True, 2: False, 8: False} and not PLAIN.prefetch_on()
    r.cfg.kernels = KernelConfig(prefetch_rows=0)
    assert not replace(g.mode_at(1), interpret=False).prefetch_on()


def test_the_lane_host_serves_the_same_replies_at_fewer_rows():
    """Ten streams of different lengths through the lane host (16 lanes: rounds of 16 rows while
    lanes past 7 decode, of 8 once they are done), rounds ahead: the replies of the padded shape."""
    from engine.scheduler.host import LaneHost
    from engine.scheduler.sequence import Sequence
    got = {}
    for buckets in (True, False):
        r = runner(buckets, True)
        host = LaneHost(r, EngineConfig(parallel=16, prefill_rows=16), clock=lambda: 0.0)
        seqs = [Sequence(prompt=prompt(6 + 3 * i, i), max_tokens=4 + 5 * (i % 4), ignore_eos=True) for i in range(10)]
        for s in seqs:
            host.submit(s)
        while any(not s.done for s in seqs):
            host.turn()
        got[buckets] = [list(s.output) for s in seqs]
        assert all(len(o) == s.max_tokens for o, s in zip(got[buckets], seqs))
    assert got[True] == got[False]


def test_the_split_attention_runs_two_pipeline_stages_only_in_64_row_rounds(monkeypatch):
    """engine/cuda/decode_attention.py STAGES: at 3 stages (Triton's default) the split kernel takes 71.7 KB of shared
    memory on sm_90 and an SM holds three, so a 64-row round's 512 items ran in two waves; 2 stages hold
    four. Rounds of 1-8 rows keep the default (2 stages lost 0.06 ms at one row on the H200). The launch is recorded here; the device run compares the bits (warps_bits)."""
    import engine.cuda.decode_attention as K
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launches.append(kw)
                return SimpleNamespace(function=0)
            return launch
    monkeypatch.setattr(K, "_split_kernel", Recorder())
    monkeypatch.setattr(K, "INTERPRET", False)
    kv = SimpleNamespace(k=torch.zeros(1, 65, 64, 8, 128), v=torch.zeros(1, 65, 64, 8, 128))
    for p in (1, 8, 64):
        K.decode_attention(kv, 0, torch.zeros(p, 32, 128), torch.arange(p), torch.zeros(p, dtype=torch.long),
                           fold=True, programs=4)
    assert [kw.get("num_stages") for kw in launches] == [None, None, 2]
    # LOADS_FIRST: the q/k fold's loads before its sums in rounds of 1-8 rows, not at 64, where holding them
    # takes the kernel to 148 registers and three programs a SM
    assert [kw["LOADS_FIRST_"] for kw in launches] == [True, True, False]


def test_the_norm_asks_its_weight_early_only_in_rounds_of_up_to_8_rows(monkeypatch):
    """engine/cuda/decode_attention.py LOADS_FIRST for the add+RMSNorm: the weight beside x at 1-8 rows (one trip to L2 on
    a small round's path), after the sum as before at 64 rows and in the prompts' many-row launches."""
    import engine.cuda.fused as KF
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid[0], kw["WFIRST_"]))
    monkeypatch.setattr(KF, "_add_rmsnorm_kernel", Recorder())
    for rows in (1, 2, 8, 64, 4096):
        x = torch.zeros(rows, 64)
        KF.add_rmsnorm(x, x, torch.ones(64), 1e-6)
    assert launches == [(1, True), (2, True), (8, True), (64, False), (4096, False)]
