"""The conventions OpenAI clients rely on, against the engine served for real on loopback."""
import asyncio

import httpx
import pytest

from tensorfold_bench.servers.launcher import launch
from tests.openai_helpers import prompt_ids, sha12, sse_events

FLAGS = ["--model", "tiny", "--parallel", "4", "--max-model-len", "512", "--prefill-rows", "8", "--max-body-mb", "1"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with launch(FLAGS, tmp_path_factory.mktemp("conv") / "server.log") as srv:
        yield srv.url


def post(url, body, path="/v1/completions"):
    return httpx.post(url + path, json=body, timeout=60)


def greedy(url, prompt, max_tokens=12, **kw):
    r = post(url, {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_models_version_and_model_name(url):
    entry = httpx.get(url + "/v1/models").json()["data"][0]
    assert {k: entry[k] for k in ("id", "object", "root", "parent", "max_model_len", "vocab_size")} == {
        "id": "tiny", "object": "model", "root": "tiny", "parent": None, "max_model_len": 512, "vocab_size": 512}
    assert httpx.get(url + "/v1/models/tiny").json() == entry
    r = httpx.get(url + "/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["message"] == "The model `nope` does not exist."
    assert isinstance(httpx.get(url + "/version").json()["version"], str)
    r = post(url, {"model": "nope", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"] == {"message": "The model `nope` does not exist.",
                                                          "type": "NotFoundError", "param": "model", "code": 404}
    assert post(url, {"model": "tiny", "prompt": "hi", "max_tokens": 1}).status_code == 200


def test_every_error_is_json_in_openai_shape(url):
    cases = [httpx.get(url + "/no/such/route"), httpx.post(url + "/health"), httpx.get(url + "/v1/completions"),
             httpx.post(url + "/v1/completions", content=b"x" * (2 * 2 ** 20)),
             httpx.post(url + "/v1/completions", content=b'{"prompt": "hi"', headers={"Content-Type": "application/json"})]
    assert [r.status_code for r in cases] == [404, 405, 405, 413, 400]
    for r in cases:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status_code and err["message"]
    assert cases[1].headers["Allow"]


@pytest.mark.parametrize("field,value", [("foo", 1), ("presence_penalty", 0.5), ("echo", True), ("logit_bias", {"1": 2}),
                                         ("best_of", 3), ("suffix", "x"), ("tools", [{"type": "function"}])])
def test_unimplemented_fields_are_400s_that_name_them(url, field, value):
    path = "/v1/chat/completions" if field == "tools" else "/v1/completions"
    body = {"messages": [{"role": "user", "content": "hi"}]} if field == "tools" else {"prompt": "hi"}
    r = post(url, {**body, field: value}, path)
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == field


def test_harmless_fields_clients_send_are_accepted(url):
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}
    plain = greedy(url, [5, 6, 7], 4)
    extra = {"user": "u1", "presence_penalty": 0, "frequency_penalty": 0.0, "echo": False, "logit_bias": {},
             "n": 1, "best_of": 1, "top_p": 1, "return_token_ids": True, "request_id": "r1", "min_tokens": 0}
    r = post(url, {**body, **extra})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]


@pytest.mark.parametrize("bad", [[], {}, 0, False, "", "urgent", 1])
def test_priority_is_an_enum(url, bad):
    r = post(url, {"prompt": "hi", "priority": bad})
    assert r.status_code == 400 and "priority" in r.json()["error"]["message"]


def test_usage_only_with_include_usage_and_token_sha_on_the_finish_chunk(url):
    prompt = prompt_ids(20, 1)
    body = {"prompt": prompt, "max_tokens": 10, "ignore_eos": True}
    ref = greedy(url, prompt, 10)
    plain = asyncio.run(sse_events(url, body))
    assert not any("usage" in e for e in plain)
    tokens = [e for e in plain if e["choices"][0]["token_ids"]]
    assert len(tokens) == 10 and all(len(e["choices"][0]["token_ids"]) == 1 for e in tokens)
    ids = [e["choices"][0]["token_ids"][0] for e in tokens]
    assert ids == ref["choices"][0]["token_ids"]
    finish = plain[-1]
    assert finish["choices"][0]["finish_reason"] == "length" and finish["token_sha"] == sha12(ids) == ref["token_sha"]
    with_usage = asyncio.run(sse_events(url, {**body, "stream_options": {"include_usage": True}}))
    last = with_usage[-1]
    assert last["choices"] == [] and last["token_sha"] == sha12(ids)
    assert last["usage"]["prompt_tokens"] == 20 and last["usage"]["completion_tokens"] == 10
    assert not any("usage" in e for e in with_usage[:-1])
    r = post(url, {**body, "stream_options": {"include_usage": True}})  # stream_options without stream
    assert r.status_code == 400 and "stream_options" in r.json()["error"]["message"]


def test_continuous_usage_stats_puts_usage_so_far_on_every_chunk(url):
    body = {"prompt": prompt_ids(7, 2), "max_tokens": 5, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events = asyncio.run(sse_events(url, body))
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3, 4, 5, 5, 5]  # tokens, finish, usage
    assert all(e["usage"]["prompt_tokens"] == 7 for e in events)


def test_chat_role_first_and_content_parts(url):
    base = {"max_tokens": 6, "ignore_eos": True}
    as_str = post(url, {**base, "messages": [{"role": "user", "content": "hello there"}]}, "/v1/chat/completions").json()
    as_parts = post(url, {**base, "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]},
                    "/v1/chat/completions").json()
    assert as_str["choices"][0]["message"]["role"] == "assistant"
    assert as_parts["choices"][0]["token_ids"] == as_str["choices"][0]["token_ids"]
    events = asyncio.run(sse_events(url, {**base, "messages": [{"role": "user", "content": "hello there"}]},
                                    "/v1/chat/completions"))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert not any("role" in e["choices"][0]["delta"] for e in events[1:])
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == as_str["choices"][0]["message"]["content"]
    r = post(url, {**base, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
             "/v1/chat/completions")
    assert r.status_code == 400 and "text" in r.json()["error"]["message"]


def test_streamed_text_equals_the_whole_text_utf8_safe(url):
    # multi-byte characters in the prompt make the random model likely to continue with bytes >= 0x80
    for seed in range(3):
        prompt = list("€ü日本".encode()) * 3 + prompt_ids(5, seed)
        whole = greedy(url, prompt, 40)["choices"][0]
        events = asyncio.run(sse_events(url, {"prompt": prompt, "max_tokens": 40, "ignore_eos": True}))
        text = "".join(e["choices"][0]["text"] for e in events)
        assert text == whole["text"]
        for e in events[:-1]:  # no chunk ends in half a character
            assert not e["choices"][0]["text"].endswith("\ufffd") or "\ufffd" in whole["text"]


def test_stop_strings_and_stop_token_ids(url):
    prompt = prompt_ids(16, 3)
    ref = greedy(url, prompt, 40)["choices"][0]
    ids, text = ref["token_ids"], ref["text"]
    # a stop token: the reply ends with it, finish "stop", stop_reason the id
    k = 5
    stop_id = ids[k]
    first = ids.index(stop_id)
    got = greedy(url, prompt, 40, stop_token_ids=[stop_id])["choices"][0]
    assert got["token_ids"] == ids[: first + 1] and got["finish_reason"] == "stop" and got["stop_reason"] == stop_id
    # a stop string: the text stops before it
    visible = [ch for ch in text if ch != "\ufffd"]
    assert visible, text  # the tiny model's greedy reply to this prompt has plain characters
    if visible:
        s = visible[len(visible) // 2]
        got = greedy(url, prompt, 40, stop=[s])["choices"][0]
        assert got["finish_reason"] == "stop" and got["stop_reason"] == s
        assert got["text"] == text[: text.index(s)]
        events = asyncio.run(sse_events(url, {"prompt": prompt, "max_tokens": 40, "ignore_eos": True, "stop": s}))
        assert "".join(e["choices"][0]["text"] for e in events) == got["text"]
        assert events[-1]["choices"][0]["finish_reason"] == "stop"
        kept = greedy(url, prompt, 40, stop=[s], include_stop_str_in_output=True)["choices"][0]
        assert kept["text"] == text[: text.index(s) + 1]


def test_n_and_a_list_of_prompts(url):
    a, b = prompt_ids(9, 4), "some text"
    ra, rb = greedy(url, a, 6), greedy(url, b, 6)
    r = greedy(url, [a, b], 6, n=2)
    choices = r["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in choices] == [ra["choices"][0]["token_ids"]] * 2 + [rb["choices"][0]["token_ids"]] * 2
    assert r["usage"]["completion_tokens"] == 24
    assert r["usage"]["prompt_tokens"] == 9 + len(b.encode())
    events = asyncio.run(sse_events(url, {"prompt": [a, b], "n": 2, "max_tokens": 6, "ignore_eos": True}))
    by_index = {}
    for e in events:
        for c in e["choices"]:
            by_index.setdefault(c["index"], []).extend(c["token_ids"])
    assert [by_index[i] for i in range(4)] == [c["token_ids"] for c in choices]


def test_max_completion_tokens(url):
    r = post(url, {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3, "ignore_eos": True},
             "/v1/chat/completions").json()
    assert r["usage"]["completion_tokens"] == 3
    r = post(url, {"prompt": "x", "max_tokens": 9, "max_completion_tokens": 2, "ignore_eos": True}).json()
    assert r["usage"]["completion_tokens"] == 2


def test_tokenize_and_detokenize(url):
    r = httpx.post(url + "/tokenize", json={"prompt": "héllo"}).json()
    assert r == {"count": 6, "max_model_len": 512, "tokens": list("héllo".encode()), "token_strs": None}
    chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] == len(chat["tokens"]) > 2
    assert httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "héllo"}
    bad = httpx.post(url + "/detokenize", json={"tokens": [1, 10 ** 6]})
    assert bad.status_code == 400 and "tokens" in bad.json()["error"]["message"]


@pytest.mark.parametrize("flag", ["--max-body-mb", "--stall-timeout-s", "--idle-timeout-s", "--body-timeout-s"])
def test_bad_limit_flags_are_one_line_and_exit_2(flag):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", "tiny", flag, "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr, r.stderr
