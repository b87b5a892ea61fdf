"""`tfengine serve` answers its first request only once the runner's background warm-up is done.

On CUDA the runner builds cuDNN's graphs for the prompt cuts on its cut thread after it starts; a
request sent meanwhile queued behind all of them (1-4 s on an H200). The warm-up here is a stand-in
future on a real tiny CPU runner; the HTTP server is replaced by a probe of the moment it would start.
"""
import sys

import engine.runner
import engine.server


class _Warm:
    """A warm-up future that records whether serve waited for it."""

    def __init__(self):
        self.waited = False

    def result(self):
        self.waited = True
        return 3


def test_serve_waits_for_the_warm_up_before_it_serves(monkeypatch, tmp_path, caplog):
    warm, seen = _Warm(), {}
    real_build = engine.runner.build_runner

    def build(cfg):
        r = real_build(cfg)
        r.cuts_warmed = warm
        return r

    async def serve_probe(host, model, bind, port, ready=None, sock=None, http=None):
        seen["waited"] = warm.waited  # the moment the engine would accept its first request
        sock.close()

    monkeypatch.setattr(engine.runner, "build_runner", build)
    monkeypatch.setattr(engine.server, "serve", serve_probe)
    monkeypatch.setattr(sys, "argv", ["tfengine", "serve", "--model", "tiny", "--port", "0", "--parallel", "2",
                                      "--max-model-len", "64", "--prefill-rows", "16"])
    from engine.cli import main
    with caplog.at_level("INFO", logger="engine.cli"):
        main()
    assert seen == {"waited": True}
    assert "prompt cuts warmed: 3 cuDNN graphs" in caplog.text
