"""Short prompt cuts on the CPU (bf16) filled together in one forward (ModelRunner.prefill_many,
CpuRunner._forward_many), and a tile's attention over the cut's rows only: where the
start-up check finds the products row-invariant (engine.cpu.packed.rows_invariant), every cut
keeps the bits it has alone, and alone the bits of the old path (padded tiles, one cut a forward),
so no greedy id moves."""
import pytest
import torch

from engine.config import EngineConfig, KernelConfig
from engine.cpu.cut_attention import cut_attention_cpu
from engine.cpu.packed import packs_bf16, rows_invariant
from engine.scheduler.host import LaneHost
from engine.runner.build import build_runner
from engine.scheduler.sequence import Sequence

R = 64
A, B, C = ([(i * 13 + 1) % 500 for i in range(40)], [(i * 5 + 3) % 500 for i in range(7)],
           [(i * 7 + 2) % 500 for i in range(100)])


def runner(batch: bool = True):
    return build_runner(EngineConfig(model="cpu", dtype="bfloat16", parallel=4, max_model_len=256, prefill_rows=R,
                                     seed=7, kernels=KernelConfig(batch_cuts=batch, cpu_cpp=False)))


@pytest.fixture(scope="module")
def pair():
    if not packs_bf16():
        pytest.skip("this CPU has no packed bf16 products (AVX2 only)")
    on, off = runner(True), runner(False)
    if not on.cpu.rows_free:
        pytest.skip("this machine's bf16 products are not row-invariant: cuts are filled one at a time")
    assert not off.cpu.rows_free and not off.batch_cuts
    return on, off


def test_tile_of_the_cuts_rows_equals_the_padded_tile():
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(300, 4, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(150, 8, 64, generator=g).to(torch.bfloat16)
    for start, t, tile in ((0, 7, 64), (3, 40, 64), (60, 90, 64), (0, 150, 128), (200, 1, 64)):
        padded = cut_attention_cpu(q[:t], k, v, start, tile)
        assert torch.equal(cut_attention_cpu(q[:t], k, v, start, tile, pad=False), padded), (start, t, tile)


def test_check_says_no_for_float32():
    r = build_runner(EngineConfig(model="tiny", dtype="float32", parallel=2, max_model_len=64, prefill_rows=16))
    assert not rows_invariant(r.cpu.packed, 16) and not r.batch_cuts and not r.cpu.rows_free


def test_cuts_together_equal_cuts_alone_and_the_old_path(pair):
    on, off = pair
    old = [off.prefill_step(0, A, 0, 40), off.prefill_step(1, B, 0, 7), off.prefill_step(2, C, 0, 64)]
    kv_old = off.kv.k[:, :3].clone(), off.kv.v[:, :3].clone()
    alone = [on.prefill_step(0, A, 0, 40), on.prefill_step(1, B, 0, 7), on.prefill_step(2, C, 0, 64)]
    assert alone == old and old[2] is None
    assert torch.equal(on.kv.k[:, :3], kv_old[0]) and torch.equal(on.kv.v[:, :3], kv_old[1])
    on.kv.k.zero_()
    on.kv.v.zero_()
    firsts, logits = on._many([(2, C, 0, 64), (0, A, 0, 40), (1, B, 0, 7)])
    assert firsts == [None, old[0], old[1]]
    with torch.inference_mode():
        assert torch.equal(logits[1], off._forward_cut(torch.tensor(A), 0, 0))  # every bit of the logits
    for lane, n in ((0, 40), (1, 7), (2, 64)):
        assert torch.equal(on.kv.k[:, lane, :n], kv_old[0][:, lane, :n])
        assert torch.equal(on.kv.v[:, lane, :n], kv_old[1][:, lane, :n])
    # C's second cut (a tile it covers in part, at 64..100) beside a new prompt in lane 3
    second = on.prefill_many([(2, C, 64, 100), (3, B, 0, 7)])
    assert second == [off.prefill_step(2, C, 64, 100), old[1]]
    assert torch.equal(on.kv.k[:, 2, :100], off.kv.k[:, 2, :100])
    with pytest.raises(ValueError, match="two cuts of one lane"):
        on.prefill_many([(0, A, 0, 40), (0, B, 0, 7)])


def test_runner_says_how_cuts_go(pair):
    on, off = pair
    assert on.describe()["cpu_prompt_cuts"].startswith("short ones filled together")
    assert off.describe()["cpu_prompt_cuts"].startswith("one at a time")


def test_lane_host_fills_short_prompts_together_with_the_replies_alone(pair):
    on, _ = pair
    alone = [on.generate(p, 6, lane=0) for p in (A, B, C)]
    calls = []
    many = on.prefill_many
    on.prefill_many = lambda items: (calls.append([(lane, s, e) for lane, _, s, e in items]), many(items))[1]
    try:
        host = LaneHost(on, EngineConfig(parallel=4, prefill_rows=R), clock=lambda: 0.0)
        seqs = []
        for p in (A, B, C):
            events = []
            s = Sequence(prompt=p, max_tokens=6, ignore_eos=True, emit=lambda k, x, ev=events: ev.append((k, x)))
            s.events = events
            host.submit(s)
            seqs.append(s)
        for _ in range(12):
            host.turn()
            for s in seqs:
                s.undrained = 0
    finally:
        del on.prefill_many
    assert calls and len(calls[0]) == 3  # the three first cuts in one forward
    assert [[x for k, x in s.events if k == "token"] for s in seqs] == alone
