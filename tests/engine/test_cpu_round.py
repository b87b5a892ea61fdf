"""The CPU decode round in C++ (engine/cpu/round.py, engine/cpu/round.cpp) gives the Python round's
bits (with the C decode attention, engine/cpu/decode_attention.c, in both, or the batched matmuls in both), and the engine keeps decoding through the Python round when it cannot be built."""
import threading
import time
from pathlib import Path

import pytest
import torch

import engine.cpu.decode_attention as cattn
import engine.cpu.round as cr
from engine.config import EngineConfig, KernelConfig, Toolchain
from engine.cpu.packed import BucketPlan
from engine.runner.build import build_runner
from marks import bf16, needs_cpu_bf16  # noqa: F401

# (lanes, tokens, positions): one row; spans apart; a drafter's second entry; lanes apart in one
# span (lanes a server hands out after others finish); every lane across span edges
ROUNDS = [([2], [65], [70]), ([0, 2, 3, 5], [3, 65, 99, 200], [10, 70, 71, 250]), ([2, 2, 4], [65, 66, 9], [70, 71, 150]),
          ([0, 2, 5], [7, 8, 9], [100, 101, 102]), ([5, 0, 1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [250, 63, 64, 127, 128, 200])]


@pytest.fixture(scope="module")
def built():
    try:
        cr.load(cr.build(Toolchain()))
    except RuntimeError as e:  # no compiler here: the fallback tests below still run
        pytest.skip(f"the C++ round cannot be built here: {e}")


@pytest.fixture(scope="module", params=[("float32", 6, True), ("float32 mkl", 6, True), ("float32", 11, True), pytest.param(("bfloat16", 6, True), marks=needs_cpu_bf16), pytest.param(("bfloat16", 11, True), marks=needs_cpu_bf16),
                                        ("float32", 6, False), pytest.param(("bfloat16", 6, False), marks=needs_cpu_bf16)])
def runner(request, built):
    dtype, parallel, c_attention = request.param  # 11 lanes: rounds of two 8-row tiles
    dtype, _, mkl = dtype.partition(" ")  # mkl: float32 weights through MKL (KernelConfig.cpu_wide=False)
    # without the C attention: the batched matmuls in both rounds
    tc = Toolchain(c_kernels=c_attention)
    r = build_runner(EngineConfig(model="tiny", dtype=dtype, parallel=parallel, max_model_len=320, prefill_rows=16,
                                  seed=3, kernels=KernelConfig(cpu_cpp=True, cpu_wide=False if mkl else None, toolchain=tc)))
    assert (r.cpu.attention is not None) == c_attention or cattn.kernel(tc) is None
    for lane in range(6):
        r.prefill(lane, [(i * 29 + lane * 13 + 3) % 256 for i in range(40 + 30 * lane)])
    return r


def test_cpp_round_is_on(runner):
    assert runner.cpu.round.ready and runner.describe()["cpu_round"] == "C++"


@pytest.mark.parametrize("case", range(len(ROUNDS)))
def test_cpp_round_gives_the_python_rounds_bits(runner, case):
    """Logits, greedy ids and the K/V rows written: equal, bit for bit."""
    r = runner
    lanes, tokens, positions = ROUNDS[case]
    rows, where = r.padded_round(lanes, tokens, positions)
    with torch.inference_mode():
        before = r.kv.k.clone(), r.kv.v.clone()
        logits, ids = r.cpu.round.rows(rows, r.spare, r.kv)
        written = r.kv.k[:, :r.spare].clone(), r.kv.v[:, :r.spare].clone()
        r.kv.k.copy_(before[0])
        r.kv.v.copy_(before[1])
        ref = r._decode_body(torch.tensor(rows), rows=list(zip(rows[2], rows[1])))
    assert torch.equal(logits[where], ref[where])
    assert ids[where].tolist() == ref[where].argmax(-1).tolist()
    assert torch.equal(written[0], r.kv.k[:, :r.spare]) and torch.equal(written[1], r.kv.v[:, :r.spare])


def test_generate_same_tokens_either_round(runner):
    r = runner
    prompt = [(i * 7 + 1) % 200 for i in range(50)]
    with_cpp = r.generate(prompt, 40, lane=1)
    r.cpu.round.on = False
    try:
        python = r.generate(prompt, 40, lane=1)
    finally:
        r.cpu.round.on = True
    assert with_cpp == python


def test_plan_runs_of_consecutive_lanes():
    """Lanes 0, 2, 5, 7 in one span attend as four runs of one lane (not one range of eight);
    lanes 0-3 as one run; a second span is a group of its own."""
    plan = BucketPlan([(0, 70), (2, 71), (5, 72), (7, 73)], spare=8, max_len=512, device="cpu")
    assert [(lo, hi) for lo, hi, *_ in plan.groups] == [(0, 1), (2, 3), (5, 6), (7, 8)]
    plan = BucketPlan([(1, 70), (0, 71), (3, 72), (2, 73), (4, 300)], spare=8, max_len=512, device="cpu")
    assert [(lo, hi, span) for lo, hi, span, *_ in plan.groups] == [(0, 4, 128), (4, 5, 320)]
    rows_out = plan.groups[0][6].tolist()
    assert rows_out == [1, 0, 3, 2]  # each lane's own row


def test_no_compiler_is_a_clear_reason(tmp_path):
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        cr.build(Toolchain.from_env({"TFENGINE_CACHE": str(tmp_path), "CXX": "no-such-compiler-here"}))


def test_background_build_then_the_decode_thread_loads(monkeypatch, built):
    """Not built yet: the server decodes through the Python round while a side thread builds;
    the next round after the build loads the library in the decoding thread and runs C++, with
    the same tokens."""
    so, gate, loads, real_load = cr.build(Toolchain()), threading.Event(), [], cr.load
    monkeypatch.setattr(cr, "library", lambda tc: Path("/nonexistent/tfengine_cpu_round.so"))
    monkeypatch.setattr(cr, "loaded", lambda: False)  # (loading the same file again is a no-op for the dispatcher)
    monkeypatch.setattr(cr, "build", lambda tc: (gate.wait(60), so)[1])
    monkeypatch.setattr(cr, "load", lambda p: (loads.append(threading.current_thread()), real_load(p)))
    r = build_runner(EngineConfig(model="tiny", dtype="float32", parallel=2, max_model_len=128, prefill_rows=16))
    prompt = [(i * 5 + 2) % 200 for i in range(30)]
    assert r.describe()["cpu_round"] == "python (C++ building)"
    python = r.generate(prompt, 12)
    gate.set()
    deadline = time.monotonic() + 60
    while r.cpu.round._built is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.describe()["cpu_round"] == "python (C++ built, loads at the next round)" and not loads  # asking never loads
    assert r.generate(prompt, 12) == python
    assert r.describe()["cpu_round"] == "C++" and loads == [threading.current_thread()]


def test_python_round_when_the_build_fails(monkeypatch):
    def fail(tc):
        raise RuntimeError("the build failed (1): test")

    monkeypatch.setattr(cr, "build", fail)
    r = build_runner(EngineConfig(model="tiny", dtype="float32", parallel=2, max_model_len=128, prefill_rows=16,
                                  kernels=KernelConfig(cpu_cpp=True)))
    assert not r.cpu.round.ready
    assert r.describe()["cpu_round"] == "python (C++ off: the build failed (1): test)"
    assert len(r.generate([5, 6, 7], 4)) == 4


def test_a_runner_that_wraps_the_round_keeps_the_python_round():
    """A tensor-parallel rank wraps _decode_body (sums across ranks, the vocabulary gathered):
    the C++ round, which would skip both, stays off there."""
    from engine.runner.cpu_runner import CpuRunner

    class Wrapped(CpuRunner):
        def _decode_body(self, inp, rows=None):
            return super()._decode_body(inp, rows)

    r = Wrapped(EngineConfig(model="tiny", dtype="float32", parallel=2, max_model_len=128, prefill_rows=16,
                             kernels=KernelConfig(cpu_cpp=True)))
    assert r.cpu.round is None and r.describe()["cpu_round"] == "python"
