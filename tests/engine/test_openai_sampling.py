"""Sampled replies and logprobs over HTTP: per-request temperature/top_p/top_k/seed, a drawn
seed reported so the reply can be replayed, logprobs for greedy and sampled replies."""
import asyncio
import math

import httpx
import pytest

pytest.importorskip("engine.scheduler.sampling")

from tensorfold_bench.servers.launcher import launch  # noqa: E402
from tests.openai_helpers import prompt_ids, sse_events  # noqa: E402

FLAGS = ["--model", "tiny", "--parallel", "4", "--max-model-len", "512", "--prefill-rows", "8"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with launch(FLAGS, tmp_path_factory.mktemp("samp") / "server.log") as srv:
        yield srv.url


def post(url, body, path="/v1/completions"):
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def ids(reply, i=0):
    return reply["choices"][i]["token_ids"]


def test_a_seeded_sampled_reply_keeps_its_ids_alone_and_beside_others(url):
    body = {"prompt": prompt_ids(20, 1), "max_tokens": 24, "ignore_eos": True, "temperature": 1.0, "seed": 11}
    alone = post(url, body)
    assert alone["seed"] == 11 and ids(post(url, body)) == ids(alone)
    greedy = post(url, {**body, "temperature": 0})
    assert ids(greedy) != ids(alone)  # T = 1 on a random model: not the argmax path
    others = [{"prompt": prompt_ids(30 + k, k), "max_tokens": 24, "ignore_eos": True, "temperature": 0.8, "seed": k}
              for k in range(3)]

    async def together():
        return await asyncio.gather(sse_events(url, body), *(sse_events(url, o) for o in others))

    events = asyncio.run(together())[0]
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == ids(alone)
    assert events[-1]["seed"] == 11


def test_an_unseeded_sampled_reply_reports_the_seed_that_replays_it(url):
    body = {"prompt": prompt_ids(10, 2), "max_tokens": 16, "ignore_eos": True, "temperature": 1.0}
    first = post(url, body)
    assert isinstance(first["seed"], int)
    assert ids(post(url, {**body, "seed": first["seed"]})) == ids(first)
    assert "seed" not in post(url, {**body, "temperature": 0})  # greedy: nothing to replay


def test_n_choices_are_each_their_own_seed(url):
    body = {"prompt": prompt_ids(10, 3), "max_tokens": 16, "ignore_eos": True, "temperature": 1.0, "seed": 5}
    both = post(url, {**body, "n": 2})
    assert ids(both, 0) == ids(post(url, body)) and ids(both, 1) == ids(post(url, {**body, "seed": 6}))
    assert ids(both, 0) != ids(both, 1)


def test_top_k_one_is_greedy(url):
    body = {"prompt": prompt_ids(10, 4), "max_tokens": 16, "ignore_eos": True}
    assert ids(post(url, {**body, "temperature": 1.0, "top_k": 1, "seed": 3})) == ids(post(url, body))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completion_logprobs(url, temperature):
    body = {"prompt": prompt_ids(12, 5), "max_tokens": 8, "ignore_eos": True, "logprobs": 3,
            "temperature": temperature, "seed": 1, "return_tokens_as_token_ids": True}  # distinct keys
    reply = post(url, body)
    lp = reply["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in ids(reply)]
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 8
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert chosen <= 0 and 3 <= len(top) <= 4 and all(v <= 0 for v in top.values())
        if temperature == 0:
            assert math.isclose(chosen, max(top.values()), abs_tol=1e-5)  # greedy picks the most likely
    plain = {k: v for k, v in body.items() if k not in ("logprobs", "return_tokens_as_token_ids")}
    assert ids(reply) == ids(post(url, plain))  # logprobs change nothing
    events = asyncio.run(sse_events(url, body))
    streamed = [e["choices"][0]["logprobs"]["token_logprobs"][0] for e in events if e["choices"][0]["token_ids"]]
    assert streamed == pytest.approx(lp["token_logprobs"])


def test_chat_logprobs(url):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": True, "logprobs": True,
            "top_logprobs": 2}
    content = post(url, body, "/v1/chat/completions")["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and all(len(c["top_logprobs"]) == 2 and isinstance(c["bytes"], list) for c in content)
    plain = post(url, {**body, "top_logprobs": None}, "/v1/chat/completions")["choices"][0]["logprobs"]["content"]
    assert all(c["top_logprobs"] == [] for c in plain)
