"""The CPU runner: exactness of cuts, lanes and padded rounds; graph fallback."""
import pytest
import torch

from engine.scheduler.backend import cuts
from engine.config import ConfigError, EngineConfig, KernelConfig
from engine.runner.build import build_runner
from engine.runner.model_runner import ModelRunner

R = 16


@pytest.fixture(scope="module")
def runner():
    return build_runner(EngineConfig(model="tiny", parallel=4, max_model_len=256, prefill_rows=R, seed=1))


def prompt(n, salt=0):
    return [(i * 37 + salt * 11 + 5) % 256 for i in range(n)]


def greedy(r, toks, n, lane=0, rows=None):
    """Prefill (cut size `rows`, whole prompt in one cut if 0) and decode alone."""
    rows = rows if rows is not None else r.prefill_rows
    grid = [(0, len(toks))] if rows == 0 else cuts(0, len(toks), rows)
    for s, e in grid:
        first = r.prefill_step(lane, toks, s, e)
    out, pos = [first], len(toks)
    while len(out) < n:
        out.append(r.decode([lane], [out[-1]], [pos])[0])
        pos += 1
    return out


@pytest.mark.parametrize("n", [R - 5, R, 3 * R, 2 * R + 7])
def test_stepped_equals_whole(runner, n):
    toks = prompt(n)
    stepped = []
    for s, e in cuts(0, n, R):  # one step at a time, decode rounds of another lane in between
        stepped.append(runner.prefill_step(1, toks, s, e))
        runner.decode([2], [7], [s])
    assert all(t is None for t in stepped[:-1]) and stepped[-1] is not None
    first_stepped = stepped[-1]
    whole = runner.prefill(0, toks)
    assert first_stepped == whole
    assert greedy(runner, toks, 8, lane=0) == greedy(runner, toks, 8, lane=3)


def test_cut_size_changes_little(runner):
    """One long cut vs many short: not the same bits (different forwards) but the same function."""
    toks = prompt(3 * R + 3)
    a = runner.cut_logits(torch.tensor(toks), 0, 0)
    pieces = [runner.cut_logits(torch.tensor(toks[s:e]), 1, s)
              for s, e in cuts(0, len(toks), R)]
    torch.testing.assert_close(torch.cat(pieces), a, rtol=1e-4, atol=1e-5)


def test_alone_vs_among_four(runner):
    target = prompt(29, salt=1)
    alone = greedy(runner, target, 12, lane=0)
    others = [prompt(5, 2), prompt(40, 3), prompt(17, 4)]
    lanes = [2, 0, 3, 1]  # the target sits in lane 2 this time
    prompts = [target] + others
    toks = [runner.prefill(lane, p) for lane, p in zip(lanes, prompts)]
    pos = [len(p) for p in prompts]
    outs = [[t] for t in toks]
    active = [0, 1, 2, 3]
    for step in range(11):
        if step == 4:
            active = [0, 2]  # neighbours come and go
        if step == 8:
            active = [0, 1, 2, 3]
        res = runner.decode([lanes[i] for i in active], [outs[i][-1] for i in active], [pos[i] for i in active])
        for i, t in zip(active, res):
            outs[i].append(t)
            pos[i] += 1
    assert outs[0] == alone


def test_generate_together_equals_each_alone(runner):
    """The checks' helper (gpu_check, bench_skinny): prompts decoded in the same rounds give each
    prompt's tokens alone."""
    prompts = [prompt(9, 5), prompt(23, 6), prompt(4, 7)]
    together = runner.generate_together(prompts, [3, 0, 1], 7)
    assert together == [runner.generate(p, 7, lane=2) for p in prompts]


def test_padded_round_is_row_invariant(runner):
    """The same row with different neighbours gives bitwise the same logits."""
    r = runner
    for lane in range(4):
        r.prefill(lane, prompt(10 + 7 * lane, lane))
    body = r._decode_body

    def logits(rows):
        inp = torch.tensor(rows, dtype=torch.long)
        with torch.inference_mode():  # the plain reference: torch ops, one SDPA a row
            from engine.models.qwen3 import ForwardPlan, TorchOps
            plan = ForwardPlan.round(inp[0], inp[1], inp[2])
            return r.model.lm_head(r.model(plan, TorchOps(r.model, r.kv, plan)))

    alone = logits(r.padded_round([1], [65], [17])[0])
    crowd = logits(r.padded_round([0, 1, 2, 3], [3, 65, 99, 200], [10, 17, 24, 31])[0])
    other = logits(r.padded_round([1, 3], [65, 1], [17, 5])[0])
    assert torch.equal(alone[1], crowd[1]) and torch.equal(alone[1], other[1])


def test_graph_path_falls_back_on_cpu():
    r = build_runner(EngineConfig(model="tiny", parallel=2, max_model_len=64, prefill_rows=8,
                                  kernels=KernelConfig(cuda_graph=True)))
    assert r.graph is None and "no CUDA graphs" in r.graph_fallback_reason
    from engine.runner.cuda_runner import CudaRunner  # the CUDA runner built on the CPU (tests) falls back too
    assert CudaRunner(EngineConfig(model="tiny", parallel=2, max_model_len=64, prefill_rows=8)).capture_graph() is False
    plain = build_runner(EngineConfig(model="tiny", parallel=2, max_model_len=64, prefill_rows=8))
    assert r.generate(prompt(12), 6) == plain.generate(prompt(12), 6)
    assert r.describe()["cuda_graph"] is False


def test_the_shared_core_never_asks_which_device():
    """Each device's paths live in its runner (cpu_runner, cuda_runner); the core branches on none."""
    import inspect
    import engine.runner.model_runner as core
    body = inspect.getsource(core)
    assert not [w for w in ("device.type", "self.cpu", "on_gpu", "torch.cuda") if w in body]
    with pytest.raises(ConfigError, match="--device must be cpu or cuda"):
        build_runner(EngineConfig(model="tiny", device="tpu"))


def test_cuda_unavailable_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA"):
        build_runner(EngineConfig(model="tiny", device="cuda"))


def test_backend_surface_and_describe(runner):
    from engine.runner.cpu_runner import CpuRunner
    assert isinstance(runner, CpuRunner) and isinstance(runner, ModelRunner)
    assert (runner.parallel, runner.max_model_len, runner.vocab_size, runner.eos_token_ids) == (4, 256, 512, (256,))
    d = runner.describe()
    for key in ("device", "device_name", "compute_capability", "cuda_version", "driver", "torch", "dtype",
                "model", "shape", "parameters"):
        assert key in d
    assert d["shape"]["head_dim"] == 16 and d["parameters"] == runner.model_config.num_parameters()
    assert sum(p.numel() for p in runner.model.parameters()) == d["parameters"]


def test_bad_inputs(runner):
    with pytest.raises(ValueError):
        runner.prefill_step(0, prompt(300), 0, 256 + 1)
    with pytest.raises(ValueError, match="rows"):  # more entries than the round has rows
        p = runner.round_rows  # the round's rows: --parallel, in whole 8-row tiles on the CPU
        runner.decode([0] * (p + 1), [1] * (p + 1), list(range(3, p + 4)))
    with pytest.raises(ValueError):
        runner.decode([0], [600], [3])
    with pytest.raises(ValueError):
        runner.decode([0], [1], [256])


def test_dummy_outputs_vary(runner):
    """Seeded random weights are not degenerate: prompts give varied greedy tokens."""
    seen = set()
    for salt in range(4):
        out = runner.generate(prompt(9, salt), 16, lane=salt)
        assert len(set(out)) >= 4
        seen.update(out)
    assert len(seen) >= 16


@pytest.mark.interpreted
def test_fused_kernels_in_interpreter():
    """The fused CUDA trunk (add+RMSNorm, q/k norm + RoPE + cache write, silu*up), run by Triton's
    interpreter on the CPU in float32, matches the plain trunk: logits, cache rows and tokens."""
    import torch
    from engine.config import EngineConfig
    from engine.runner.cuda_runner import CudaRunner
    r = CudaRunner(EngineConfig(model="tiny", parallel=2, max_model_len=32, prefill_rows=16))
    toks = [(i * 13 + 1) % 256 for i in range(12)]
    with torch.inference_mode():
        a = r.cut_logits(torch.tensor(toks), 0, 0)
        b = r.cut_logits(torch.tensor(toks), 1, 0, fused=True)
        assert (a - b).abs().max() < 1e-5
        assert (r.kv.k[:, 0, :12] - r.kv.k[:, 1, :12]).abs().max() < 1e-5
        assert (r.kv.v[:, 0, :12] - r.kv.v[:, 1, :12]).abs().max() < 1e-5
    plain = r.generate(toks, 4, lane=0)
    r.fused = True
    assert r.generate(toks, 4, lane=1) == plain


@pytest.mark.interpreted
def test_triton_decode_kernel_in_interpreter(monkeypatch):
    """The CUDA decode-attention kernel, run by Triton's interpreter on the CPU: it agrees with
    the per-row loop and a row's result is bitwise independent of its neighbours."""
    import torch
    import engine.cuda.decode_attention as K
    from engine.config import EngineConfig
    from engine.runner.build import build_runner
    from engine.models.qwen3 import decode_attention_loop
    monkeypatch.setattr(K, "SPLIT", 32)
    monkeypatch.setattr(K, "BLOCK", 16)
    r = build_runner(EngineConfig(model="tiny", parallel=3, max_model_len=96, prefill_rows=16))
    for lane, n in enumerate([5, 70, 33]):
        r.prefill(lane, [(i * 7 + lane) % 256 for i in range(n)])
    q = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(0))
    lanes, pos = torch.tensor([0, 1, 3]), torch.tensor([4, 69, 0])
    a = K.decode_attention(r.kv, 1, q, lanes, pos)
    b = decode_attention_loop(r.kv, 1, q, lanes, pos)
    assert (a[:2] - b[:2]).abs().max() < 1e-5, (a - b).abs().max()
    q2 = q.clone(); q2[0] = 1.0
    c = K.decode_attention(r.kv, 1, q2, torch.tensor([3, 1, 2]), torch.tensor([0, 69, 32]))
    assert torch.equal(a[1], c[1])


@pytest.mark.parametrize("rows,max_len,split", [(1024, 32256, 2048), (512, 32256, 2048), (2048, 32256, 2048),
                                                 (256, 4096, 8192)])
def test_warm_cuts_cover_every_cut_kernel_a_prompt_meets(rows, max_len, split):
    """Each (row-count kind, one split or several) a grid prompt's cuts launch with is warmed at
    start-up, so no request pays Triton's compile: a 32k prompt's first deep cut is the first to
    merge splits, and its 0.6 s compile landed in the first server's first long prompt."""
    from engine.runner.cuda_runner import warm_cuts

    def rows_kind(n):  # the trunk's kernels: Triton specializes an int at 1, a multiple of 16 or neither
        return 1 if n == 1 else 16 if n % 16 == 0 else 0

    def merges(n, start):  # cut_flash launches its merge kernel for a cut whose keys span two splits
        return (start + n - 1) // split > 0

    warm = warm_cuts(rows, max_len, split)
    for length in (max_len - 1, 3 * rows + 17):
        met = list(cuts(0, min(length, max_len), rows))
        assert {rows_kind(e - s) for s, e in met} <= {rows_kind(n) for n, _ in warm}
        if any(merges(e - s, s) for s, e in met):
            assert any(merges(n, s) for n, s in warm), (length, warm)
