"""The test hooks' wrapper backend (engine/faults.py), alone and in a real tiny server."""
import asyncio
import subprocess
import sys

import httpx
import pytest

import engine.faults as faults_mod
from engine.config import ConfigError, EngineConfig
from engine.faults import Faults, FaultyBackend, with_faults
from engine.runner.build import build_runner
from tensorfold_bench.servers.launcher import launch
from test_server_e2e import FLAGS, ids_of, prompt_ids, stream, wait_idle


class Stub:
    parallel, max_model_len, vocab_size, eos_token_ids = 2, 64, 10, (9,)

    def prefill_step(self, lane, tokens, start, end):
        return 1

    def decode(self, lanes, tokens, positions):
        return [2] * len(lanes)


def test_unset_means_no_wrapper():
    stub = Stub()
    assert not Faults.from_env({}).any
    assert with_faults(stub, Faults.from_env({"TFENGINE_FAIL_STEP": " "})) is stub


@pytest.mark.parametrize("name,value", [("TFENGINE_FAIL_STEP", "x"), ("TFENGINE_FAIL_ROUND", "0"),
                                        ("TFENGINE_FAIL_ROUND", "-2"), ("TFENGINE_DECODE_SLEEP_MS", "fast"),
                                        ("TFENGINE_DECODE_SLEEP_MS", "-5"), ("TFENGINE_DECODE_SLEEP_MS", "nan")])
def test_a_malformed_value_names_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        Faults.from_env({name: value})


def test_the_kth_step_and_round_fail_once_and_attributes_pass_through():
    b = with_faults(Stub(), Faults.from_env({"TFENGINE_FAIL_STEP": "2", "TFENGINE_FAIL_ROUND": "3"}))
    assert isinstance(b, FaultyBackend) and (b.parallel, b.eos_token_ids) == (2, (9,))
    assert b.prefill_step(0, [1, 2], 0, 2) == 1
    with pytest.raises(RuntimeError, match="injected failure at prefill step 2"):
        b.prefill_step(0, [1, 2], 0, 2)
    assert b.prefill_step(0, [1, 2], 0, 2) == 1
    assert b.decode([0], [1], [2]) == [2] and b.decode([0], [1], [2]) == [2]
    with pytest.raises(RuntimeError, match="injected failure at decode round 3"):
        b.decode([0, 1], [1, 1], [2, 2])
    assert b.decode([0], [1], [2]) == [2]


def test_decode_sleep_sleeps_each_round(monkeypatch):
    slept = []
    monkeypatch.setattr(faults_mod.time, "sleep", slept.append)
    b = with_faults(Stub(), Faults.from_env({"TFENGINE_DECODE_SLEEP_MS": "20"}))
    b.prefill_step(0, [1], 0, 1)
    b.decode([0], [1], [1])
    b.decode([0], [1], [2])
    assert slept == [0.02, 0.02]


def test_a_bad_hook_value_is_exit_2_before_the_model_loads():
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--port", "1"], capture_output=True, text=True,
                       env={**__import__("os").environ, "TFENGINE_FAIL_ROUND": "soon"}, timeout=60)
    assert r.returncode == 2 and "TFENGINE_FAIL_ROUND" in r.stderr and "Traceback" not in r.stderr


def test_a_failed_decode_round_ends_its_streams_and_later_replies_keep_their_ids(tmp_path):
    """Round 6 fails: the two streams in it end with an error event; the server serves on, and
    later replies (two at once) equal the same model's tokens computed here, alone."""
    from engine.cpu.packed import cpu_dtype
    ref = build_runner(EngineConfig(model="tiny", dtype=cpu_dtype()[0], parallel=4, max_model_len=4096,
                                    prefill_rows=8))  # the server's default dtype on this CPU
    later = [prompt_ids(9, 21), prompt_ids(30, 22)]
    expected = [ref.generate(p, 20) for p in later]
    # rounds of 40 ms: both streams are in round 6 even when a loaded host starts the second late
    with launch(FLAGS, tmp_path / "fail_round.log", env={"TFENGINE_FAIL_ROUND": "6", "TFENGINE_DECODE_SLEEP_MS": "40"}) as srv:
        async def first():
            bodies = [{"prompt": prompt_ids(8, 23 + i), "max_tokens": 50, "ignore_eos": True} for i in range(2)]
            return await asyncio.gather(*(stream(srv.url, b) for b in bodies))

        failed = asyncio.run(first())
        for events, final in failed:
            assert "error" in final and "decode round 6" in final["error"]["message"]
            assert 0 < len(events) < 50
        assert wait_idle(srv.url)["tfengine_failed_streams_total"] == 2

        async def second():
            return await asyncio.gather(*(stream(srv.url, {"prompt": p, "max_tokens": 20, "ignore_eos": True})
                                          for p in later))

        got = asyncio.run(second())
        assert [ids_of(events) for events, _ in got] == expected
        assert all(final["choices"][0]["finish_reason"] == "length" for _, final in got)
