"""`tfengine serve` answers its first request only once the runner's background warm-up is done.

On CUDA the runner builds cuDNN's graphs for the prompt cuts on its cut thread after it starts; a
request sent meanwhile queued behind all of them (1-4 s on an H200). The warm-up here is a stand-in
future on a real tiny CPU runner; the HTTP server is replaced by a probe of the moment it would start.
"""
import sys

import pytest

import engine.runner.build
import engine.server.http


class _Warm:
    """A warm-up future that records whether serve waited for it."""

    def __init__(self):
        self.waited = False

    def result(self):
        self.waited = True
        return 3


def test_serve_waits_for_the_warm_up_before_it_serves(monkeypatch, tmp_path, caplog):
    warm, seen = _Warm(), {}
    real_build = engine.runner.build.build_runner

    def build(cfg):
        r = real_build(cfg)
        r.cuts_warmed = warm
        return r

    async def serve_probe(host, model, bind, port, ready=None, sock=None, http=None):
        seen["waited"] = warm.waited  # the moment the engine would accept its first request
        sock.close()

    monkeypatch.setattr(engine.runner.build, "build_runner", build)
    monkeypatch.setattr(engine.server.http, "serve", serve_probe)
    monkeypatch.setattr(sys, "argv", ["tfengine", "serve", "--model", "tiny", "--port", "0", "--parallel", "2",
                                      "--max-model-len", "64", "--prefill-rows", "16"])
    from engine.cli import main
    with caplog.at_level("INFO", logger="engine.cli"):
        main()
    assert seen == {"waited": True}
    assert "prompt cuts warmed: 3 cuDNN graphs" in caplog.text


@pytest.mark.interpreted
def test_the_warm_up_runs_the_prompt_paths_in_the_spare_lane_only():
    """The warm-up's cuts (a full cut, a 17-row tail, batched forwards of one and two cuts) run in
    the spare lane: the lanes requests own keep their bits, and replies after it are unchanged."""
    import torch
    from engine.config import EngineConfig
    from engine.runner.cuda_runner import CudaRunner
    r = CudaRunner(EngineConfig(model="tiny", parallel=2, max_model_len=96, prefill_rows=16))
    r.fused = r.batch_cuts = True  # the CUDA path's kernels, under the interpreter
    a = [(i * 13 + 1) % 256 for i in range(20)]
    before = r.generate(a, 4, lane=0)
    kv = r.kv.k[:, :2].clone(), r.kv.v[:, :2].clone()
    r.kv.k[:, r.spare].zero_()
    r.kv.v[:, r.spare].zero_()
    assert r._warm_cuts() == 0  # no cuDNN on the CPU
    assert torch.equal(r.kv.k[:, :2], kv[0]) and torch.equal(r.kv.v[:, :2], kv[1])
    spare = r.kv.k[0, r.spare].flatten(1).abs().sum(-1)
    assert (spare[:33] > 0).all(), "the full cut and its tail"  # rows 0-15, then 16-32
    assert (spare[64:96] > 0).all(), "the batched forward of two cuts"
    assert r.generate(a, 4, lane=1) == before
