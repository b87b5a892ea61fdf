"""The engine served for real on loopback (tiny preset), driven by a real streaming client."""
import asyncio
import json
import time

import httpx
import pytest

from engine.server.metrics import parse_metrics
from engine.server.render import token_sha as sha12  # the engine's one rule; the harness checks it with its own
from tensorfold_bench.servers.launcher import launch

FLAGS = ["--model", "tiny", "--parallel", "4", "--max-model-len", "4096", "--prefill-rows", "8"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launch(FLAGS, tmp_path_factory.mktemp("srv") / "server.log") as srv:
        yield srv.url


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    """The plain reference: no prompt cache, whole prompts."""
    flags = FLAGS + ["--no-prompt-cache", "--prefill-mode", "whole"]
    with launch(flags, tmp_path_factory.mktemp("plain") / "server.log") as srv:
        yield srv.url


def prompt_ids(n, seed):
    return [(seed * 7919 + i * 104729) % 256 for i in range(n)]


async def stream(url, body, *, path="/v1/completions", stop_after=None, on_first=None):
    """Stream a request; return (events, final). `stop_after` closes the connection after that
    many token events."""
    events, final, finish = [], None, None
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", url + path, json={**body, "stream": True,
                                                           "stream_options": {"include_usage": True}}) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    final = obj
                    continue
                if obj.get("usage"):  # the usage chunk (choices: []): the finish chunk's choice kept
                    final = {**obj, "choices": finish["choices"]}
                    continue
                if obj["choices"][0]["finish_reason"]:  # the finish chunk: no token
                    finish = obj
                    continue
                events.append(obj)
                if len(events) == 1 and on_first:
                    on_first.set()
                if stop_after and len(events) >= stop_after:
                    return events, None
    return events, final


def ids_of(events):
    return [t for e in events for t in e["choices"][0]["token_ids"]]


def metrics(url):
    return parse_metrics(httpx.get(url + "/metrics").text)


def wait_idle(url, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(url)
        if m["tfengine_running_streams"] == 0 and m["tfengine_free_lanes"] == 4:
            return m
        time.sleep(0.05)
    raise AssertionError(f"lanes not free: {metrics(url)}")


def test_health_models_engine(server):
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    models = httpx.get(server + "/v1/models").json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 4096
    info = httpx.get(server + "/v1/engine").json()
    assert info["config"]["parallel"] == 4 and info["engine"]["shape"]


def test_stream_one_event_per_token_with_ids_and_usage(server):
    prompt = prompt_ids(20, 1)
    events, final = asyncio.run(stream(server, {"prompt": prompt, "max_tokens": 12, "ignore_eos": True}))
    assert len(events) == 12
    assert all(len(e["choices"][0]["token_ids"]) == 1 for e in events)
    ids = ids_of(events)
    assert final["usage"] == {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32,
                              "prompt_tokens_details": {"cached_tokens": final["usage"]["prompt_tokens_details"]["cached_tokens"]}}
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["token_sha"] == sha12(ids)
    # The same request without streaming gives the same ids.
    body = httpx.post(server + "/v1/completions", json={"prompt": prompt, "max_tokens": 12, "ignore_eos": True}).json()
    assert body["choices"][0]["token_ids"] == ids and body["token_sha"] == sha12(ids)


def test_text_prompt_and_chat(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 5
    events, final = asyncio.run(stream(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                "ignore_eos": True}, path="/v1/chat/completions"))
    assert len(events) == 4 and events[0]["object"] == "chat.completion.chunk"
    assert "content" in events[0]["choices"][0]["delta"]
    assert final["usage"]["completion_tokens"] == 4


def test_disconnect_mid_stream_frees_the_lane(server):
    before = metrics(server)["tfengine_cancelled_streams_total"]
    events, _ = asyncio.run(stream(server, {"prompt": prompt_ids(10, 2), "max_tokens": 3000, "ignore_eos": True},
                                   stop_after=3))
    assert len(events) == 3
    m = wait_idle(server)
    assert m["tfengine_cancelled_streams_total"] == before + 1


BAD = [
    (b"{not json", "JSON"),
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": [1, 2, 10**6]}, "vocabulary"),
    ({"prompt": [1] * 5000}, "context length"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": -3}, "max_tokens"),
    ({"prompt": [1, 2], "stream": "yes"}, "stream"),
    ({"prompt": [1, 2], "priority": "urgent"}, "priority"),
    ({"prompt": []}, "empty"),
    ({"prompt": [1, 2], "n": 0}, "'n'"),
    ({"prompt": [1, 2], "priority": ""}, "priority"),
]


def test_bad_input_is_a_400_and_a_neighbour_stream_keeps_its_tokens(server, plain_server):
    body = {"prompt": prompt_ids(30, 3), "max_tokens": 80, "ignore_eos": True}
    reference = httpx.post(plain_server + "/v1/completions", json=body).json()["choices"][0]["token_ids"]

    async def main():
        started = asyncio.Event()
        neighbour = asyncio.create_task(stream(server, body, on_first=started))
        await started.wait()
        async with httpx.AsyncClient(timeout=30) as client:
            for payload, word in BAD:
                kw = {"content": payload} if isinstance(payload, bytes) else {"json": payload}
                r = await client.post(server + "/v1/completions", headers={"Content-Type": "application/json"}, **kw)
                assert r.status_code == 400, (payload, r.text)
                assert word in r.json()["error"]["message"], (payload, r.text)
        return await neighbour

    events, final = asyncio.run(main())
    assert ids_of(events) == reference and final["token_sha"] == sha12(reference)


def test_cancel_mid_prompt_then_the_lane_serves_the_next_request(server, plain_server):
    long_prompt = prompt_ids(3000, 4)  # 375 cuts of 8 rows
    steps_before = metrics(server)["tfengine_prompt_steps_total"]

    async def cancel_during_prompt():
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", server + "/v1/completions",
                                     json={"prompt": long_prompt, "max_tokens": 5, "stream": True}) as resp:
                assert resp.status_code == 200
                while metrics(server)["tfengine_prompt_steps_total"] < steps_before + 20:
                    await asyncio.sleep(0.01)
        # leaving the block closes the connection mid-prompt

    asyncio.run(cancel_during_prompt())
    m = wait_idle(server)
    assert m["tfengine_prompt_steps_total"] < steps_before + 375  # it stopped between cuts
    body = {"prompt": long_prompt, "max_tokens": 10, "ignore_eos": True}
    again = httpx.post(server + "/v1/completions", json=body, timeout=60).json()
    plain = httpx.post(plain_server + "/v1/completions", json=body, timeout=60).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # resumed from complete cuts
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] % 8 == 0
    assert again["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]


def test_four_concurrent_streams_equal_the_plain_replies(server, plain_server):
    bodies = [{"prompt": prompt_ids(n, 10 + n), "max_tokens": 24, "ignore_eos": True} for n in (5, 8, 33, 70)]
    plain = [httpx.post(plain_server + "/v1/completions", json=b).json()["token_sha"] for b in bodies]

    async def together():
        return await asyncio.gather(*(stream(server, b) for b in bodies))

    got = [final["token_sha"] for _, final in asyncio.run(together())]
    assert got == plain


def test_a_client_gone_mid_round_leaves_its_neighbours_every_token_in_order(server, plain_server):
    """Tokens reach the HTTP loop a round at a time (engine/server/handoff.py): three streams share
    rounds with one whose client leaves after 3 tokens; each still gets one chunk a token, in order,
    with the plain reply's ids, and the gone stream's lane is freed."""
    bodies = [{"prompt": prompt_ids(n, 40 + n), "max_tokens": 40, "ignore_eos": True} for n in (6, 9, 12)]
    plain = [httpx.post(plain_server + "/v1/completions", json=b).json()["choices"][0]["token_ids"] for b in bodies]
    gone = {"prompt": prompt_ids(7, 77), "max_tokens": 3000, "ignore_eos": True}
    before = metrics(server)["tfengine_cancelled_streams_total"]

    async def together():
        return await asyncio.gather(stream(server, gone, stop_after=3), *(stream(server, b) for b in bodies))

    (gone_events, _), *rest = asyncio.run(together())
    assert len(gone_events) == 3
    for (events, final), ids in zip(rest, plain):
        assert [len(e["choices"][0]["token_ids"]) for e in events] == [1] * 40
        assert ids_of(events) == ids and final["choices"][0]["finish_reason"] == "length"
    assert wait_idle(server)["tfengine_cancelled_streams_total"] == before + 1


def test_injected_step_failure_leaves_the_neighbour_untouched(tmp_path, plain_server):
    a_body = {"prompt": prompt_ids(8, 5), "max_tokens": 60, "ignore_eos": True}  # one cut: step 1
    reference = httpx.post(plain_server + "/v1/completions", json=a_body).json()["token_sha"]
    with launch(FLAGS, tmp_path / "fault.log", env={"TFENGINE_FAIL_STEP": "3"}) as srv:
        async def main():
            started = asyncio.Event()
            a = asyncio.create_task(stream(srv.url, a_body, on_first=started))
            await started.wait()
            b = await stream(srv.url, {"prompt": prompt_ids(100, 6), "max_tokens": 5})  # steps 2, 3, ...
            return await a, b

        (a_events, a_final), (b_events, b_final) = asyncio.run(main())
        assert "error" in b_final and "injected" in b_final["error"]["message"]
        assert a_final["token_sha"] == reference and len(a_events) == 60
        m = wait_idle(srv.url)
        assert m["tfengine_failed_streams_total"] == 1
        # The failed lane serves again.
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": prompt_ids(12, 7), "max_tokens": 3})
        assert r.status_code == 200


def test_drafter_server_replies_equal_plain(tmp_path, plain_server):
    bodies = [{"prompt": [(i % 9) * 11 + 3 for i in range(60)], "max_tokens": 40, "ignore_eos": True},
              {"prompt": prompt_ids(50, 9), "max_tokens": 40, "ignore_eos": True}]
    plain = [httpx.post(plain_server + "/v1/completions", json=b).json()["token_sha"] for b in bodies]
    with launch(FLAGS + ["--drafter", "ngram"], tmp_path / "drafter.log") as srv:
        got = [httpx.post(srv.url + "/v1/completions", json=b).json()["token_sha"] for b in bodies]
        undrafted = httpx.post(srv.url + "/v1/completions", json={**bodies[0], "draft": False}).json()["token_sha"]
        m = metrics(srv.url)
    assert got == plain and undrafted == plain[0]
    assert m["tfengine_accepted_drafts_total"] > 0
