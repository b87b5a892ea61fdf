"""Tensor parallel on the CPU: real worker ranks over gloo, the `tiny` preset, the real HTTP server.

At N = 2 replies keep their ids across schedules (alone = beside others, stepped = whole, prompt
cache, seeded sampling); N = 2 logits equal N = 1's within rounding (the same dummy weights,
sliced); the N > 2 sum is added in rank order, the same bits on every rank and for any row count;
a killed rank ends the server with one line within seconds; bad --tensor-parallel values are a
one-line CLI error."""
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import fresh
from tensorfold_bench.servers.launcher import free_port, launch

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--model", "tiny", "--dtype", "float32", "--parallel", "4", "--max-model-len", "512",
         "--prefill-rows", "8", "--tensor-parallel", "2"]
ENV = {"PYTHONPATH": str(ROOT)}


def prompt_ids(n, seed):
    return [(seed * 7919 + i * 104729) % 256 for i in range(n)]


BODIES = [{"prompt": prompt_ids(n, 10 + n), "max_tokens": 20, "ignore_eos": True} for n in (5, 8, 33, 70)]
SAMPLED = {"prompt": prompt_ids(21, 3), "max_tokens": 20, "ignore_eos": True, "temperature": 0.9, "seed": 11}


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """Stepped prompts, the prompt cache and the n-gram drafter's drafts checked in padding rows."""
    with launch(FLAGS + ["--drafter", "ngram"], tmp_path_factory.mktemp("tp") / "server.log", env=ENV) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The plain reference at the same TP size: whole prompts, no prompt cache."""
    flags = FLAGS + ["--prefill-mode", "whole", "--no-prompt-cache"]
    with launch(flags, tmp_path_factory.mktemp("tpw") / "server.log", env=ENV) as srv:
        yield srv.url


def ids(url, body):
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


async def together(url, bodies):
    async with httpx.AsyncClient(timeout=60) as client:
        rs = await asyncio.gather(*(client.post(url + "/v1/completions", json=b) for b in bodies))
    return [r.json()["choices"][0]["token_ids"] for r in rs]


def test_engine_reports_the_ranks(stepped):
    eng = httpx.get(stepped + "/v1/engine").json()
    assert eng["config"]["tensor_parallel"] == 2
    assert eng["engine"]["tensor_parallel"] == 2 and len(eng["engine"]["devices"]) == 2


def test_replies_equal_among_schedules(stepped, whole):
    plain = [ids(whole, b) for b in BODIES]
    assert all(len(p) == 20 for p in plain)
    assert [ids(stepped, b) for b in BODIES] == plain  # stepped, alone
    assert asyncio.run(together(stepped, BODIES)) == plain  # stepped, beside each other
    assert asyncio.run(together(whole, BODIES[::-1])) == plain[::-1]  # whole, beside each other
    assert [ids(stepped, b) for b in BODIES] == plain  # again: the prompt cache's reuse
    m = httpx.get(stepped + "/metrics").text
    assert float(re.search(r"^tfengine_drafted_tokens_total (\S+)", m, re.M).group(1)) > 0  # drafts were checked


def test_seeded_sampling_alone_equals_beside_others(stepped, whole):
    alone = ids(whole, SAMPLED)
    assert alone != ids(whole, {**SAMPLED, "seed": 12})  # the seed matters: the check can fail
    got = asyncio.run(together(stepped, [SAMPLED, *BODIES[:3]]))
    assert got[0] == alone


def one_rank_against_two():
    """N = 2 logits within rounding of N = 1's, the same argmax and greedy ids (run by fresh.run:
    the ranks of a tensor-parallel runner are processes of their own, joined in a process group)."""
    import torch
    from engine.config import EngineConfig
    from engine.runner.build import build_runner
    from engine.parallel.launch import start_tensor_parallel
    cfg = EngineConfig(model="tiny", dtype="float32", parallel=4, max_model_len=512, prefill_rows=8)
    one = build_runner(cfg)
    two = start_tensor_parallel(EngineConfig(**{**cfg.__dict__, "tensor_parallel": 2}), 1)
    worst = 0.0
    for n in (7, 40):
        p = [(i * 37) % 256 for i in range(n)]
        two.workers.send(("prefill_step", (1, p, 0, n), {}))  # the worker's half of the same forward
        a = one._forward_cut(torch.tensor(p), 1, 0)
        b = two.runner._forward_cut(torch.tensor(p), 1, 0)
        assert a.shape == b.shape == (512,), (a.shape, b.shape)
        worst = max(worst, (a - b).abs().max().item() / a.abs().max().item())
        assert torch.equal(a.argmax(), b.argmax())
    g1 = one.generate(list(range(30)), 24, lane=2)
    tok = [two.prefill_step(2, list(range(30)), s, min(s + 8, 30)) for s in range(0, 30, 8)][-1]
    g2 = [tok]
    for q in range(30, 30 + 23):
        g2.append(two.decode([2], [g2[-1]], [q])[0])
    two.close()
    assert g1 == g2, (g1, g2)
    assert worst < 1e-5, worst


def test_logits_within_rounding_of_one_rank():
    r = fresh.run(one_rank_against_two, env={**os.environ, **ENV})
    assert r.returncode == 0, r.stderr[-3000:]


def sum_rank(rank, world, port):
    """One rank of `world` summing partials over gloo, in a process of its own (run by fresh.run)."""
    import torch
    import torch.distributed as dist
    from engine.parallel.group import TensorParallel, join
    rank, world, port = int(rank), int(world), int(port)
    join("cpu", rank, world, dist.TCPStore("127.0.0.1", port, world, rank == 0, wait_for_workers=False))
    tp = TensorParallel(rank, world, vocab=10)
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(6, 33, generator=g) * 10 ** torch.randint(-3, 4, (6, 33), generator=g) for _ in range(world)]
    got = tp.reduce(parts[rank].clone())
    want = parts[0] + parts[1]
    for p in parts[2:]:
        want = want + p
    assert torch.equal(got, want), "not the rank-order sum"
    assert torch.equal(tp.reduce(parts[rank][2:5].clone()), want[2:5]), "a row changed with its neighbours"
    mine = torch.arange(4.0) + 4 * rank  # a vocabulary shard of 4 a rank, cut to 10
    assert torch.equal(tp.gather_vocab(mine[None]), torch.arange(10.0)[None])
    dist.barrier()
    os._exit(0)  # rank 0's store must outlive the others' teardown: none


def test_three_ranks_sum_in_rank_order():
    port = free_port()
    procs = [subprocess.Popen(fresh.command(sum_rank, r, 3, port), cwd=ROOT,
                              env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]


def route_rank(rank, port):
    """One of two ranks routing its sums, in a process of its own (run by fresh.run)."""
    import torch
    import torch.distributed as dist
    from engine.parallel.group import TensorParallel, join
    from engine.parallel.symm import symm_reduce
    rank, port = int(rank), int(port)
    join("cpu", rank, 2, dist.TCPStore("127.0.0.1", port, 2, rank == 0, wait_for_workers=False))
    assert symm_reduce(None, torch.device("cpu"), torch.float32, 2) is None  # CPU: gloo sums, no collective

    class PeerSum:  # what the one-shot kernel computes, through gloo: p0 + p1, for tensors up to 8 values
        calls = 0
        def fits(self, y):
            return y.numel() <= 8
        def __call__(self, y):
            PeerSum.calls += 1
            parts = [torch.empty_like(y) for _ in range(2)]
            dist.all_gather(parts, y)
            return parts[0] + parts[1]

    class OffByOne(PeerSum):
        def __call__(self, y):
            return super().__call__(y) + 1

    tp = TensorParallel(rank, 2, vocab=10, symm=PeerSum())
    small, big = torch.arange(8.0) + rank, torch.arange(16.0) + rank
    want_small, want_big = 2 * torch.arange(8.0) + 1, 2 * torch.arange(16.0) + 1
    assert torch.equal(tp.reduce(small.clone()), want_small) and PeerSum.calls == 1, "small: not the peer sum"
    assert torch.equal(tp.reduce(big.clone()), want_big) and PeerSum.calls == 1, "big: not the collective's sum"
    assert tp.symm_agrees(small)
    tp.symm = OffByOne()
    assert not tp.symm_agrees(small), "a wrong sum passed the bit check"
    tp.skip_sums = True
    assert tp.reduce(small) is small  # timing only: no sum
    dist.barrier()
    os._exit(0)


def test_small_sums_go_to_the_peer_sum_and_the_bit_check_catches_a_wrong_one():
    """TensorParallel's routing at two ranks (the one-shot kernel itself needs two GPUs)."""
    port = free_port()
    procs = [subprocess.Popen(fresh.command(route_rank, r, port), cwd=ROOT,
                              env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]


def test_a_killed_rank_ends_the_server_within_seconds(tmp_path):
    log = tmp_path / "server.log"
    with launch(FLAGS, log, env=ENV) as srv:
        assert ids(srv.url, BODIES[0])
        pid = int(re.search(r"tensor parallel: rank 1 is pid (\d+)", log.read_text()).group(1))
        long = {"prompt": prompt_ids(40, 1), "max_tokens": 400, "ignore_eos": True}  # in flight at the kill

        def send():
            with contextlib.suppress(httpx.HTTPError):  # the server goes away under it
                httpx.post(srv.url + "/v1/completions", json=long, timeout=60)

        threading.Thread(target=send, daemon=True).start()
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while srv.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.proc.poll() is not None, "the server outlived its rank by 10 s"
        text = log.read_text()
        assert f"tensor parallel rank 1 (pid {pid}) exited with code -9: the server stops" in text
        assert "Traceback" not in text


@pytest.mark.parametrize("value, why", [("3", "must divide"), ("4", "must divide"), ("0", "at least 1"),
                                         ("two", "integer")])
def test_bad_tensor_parallel_values_are_one_line_errors(value, why):
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", "tiny", "--tensor-parallel", value,
                        "--check"], capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **ENV})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tensor-parallel" in lines[0] and why in lines[0], r.stderr


def test_the_harness_passes_the_flag_and_names_every_gpu():
    from tensorfold_bench.session.defaults import engine_setup
    from tensorfold_bench.report.fmt import environment_lines

    def setup(n):
        return engine_setup(device="cuda", model=None, dtype=None, parallel=None, prefill_rows=None,
                            max_model_len=None, seed=0, trace=False, engine_args=None, tensor_parallel=n)

    flags = setup(2).flags()
    assert flags[flags.index("--tensor-parallel") + 1] == "2"
    assert "--tensor-parallel" not in setup(1).flags()
    desc = {"device_name": "NVIDIA H200", "devices": ["NVIDIA H200", "NVIDIA H200"], "tensor_parallel": 2}
    data = {"environment": {"engine": {"engine": desc, "config": {}}}, "settings": {}, "variants": [], "runs": []}
    assert "- Device: 2 x NVIDIA H200 (tensor parallel 2)" in environment_lines(data)[0]


def test_a_worker_ends_when_rank_0_dies(tmp_path):
    log = tmp_path / "server.log"
    with launch(FLAGS, log, env=ENV) as srv:
        worker = int(re.search(r"tensor parallel: rank 1 is pid (\d+)", log.read_text()).group(1))
        rank0 = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
        os.kill(rank0, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
            if Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break  # exited, not yet reaped
            time.sleep(0.1)
        assert not Path(f"/proc/{worker}").exists() or \
            Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", "rank 1 outlived rank 0"
        assert srv.url


def test_safetensors_load_the_same_shards_as_dummy(tmp_path):
    from dataclasses import replace

    import torch

    from engine.models.presets import PRESETS
    from engine.parallel.weights import load_shard
    from engine.models.weights import load_model, save_pretrained

    for tied in (False, True):
        cfg = replace(PRESETS["tiny"], vocab_size=511, tie_word_embeddings=tied)  # 511: the last shard padded
        full = load_model(cfg, "dummy", None, "cpu", "float32", seed=3)
        d = save_pretrained(full, cfg, tmp_path / f"m{tied}", max_shard_bytes=200_000)
        for rank in (0, 1):
            a = load_shard(cfg, "dummy", None, "cpu", "float32", 3, rank, 2).state_dict()
            b = load_shard(cfg, "safetensors", d, "cpu", "float32", 3, rank, 2).state_dict()
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        q = full.model.layers[1].self_attn.q_proj.weight
        assert torch.equal(a["model.layers.1.self_attn.q_proj.weight"], q[q.shape[0] // 2:])
        o = full.model.layers[0].mlp.down_proj.weight
        assert torch.equal(a["model.layers.0.mlp.down_proj.weight"], o[:, o.shape[1] // 2:])
        head = a["lm_head.weight"]
        assert head.shape[0] == 256 and torch.equal(head[:255], full.lm_head.weight[256:]) and not head[255].any()
