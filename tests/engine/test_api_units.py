"""The HTTP layer's pure parts, without a server: request fields, incremental text, stop
handling, body checks and logprob shapes."""
from dataclasses import dataclass, field

import pytest

from engine.server.errors import ApiError, BadRequest
from engine.server.jsonparse import parse_checked
from engine.server.params import parse_chat, parse_completion
from engine.server.render import Logprobs
from engine.server.text import ChoiceText
from engine.models.tokenizer import ByteTokenizer


@dataclass
class Model:
    name: str = "m"
    vocab_size: int = 512
    max_model_len: int = 64
    tokenizer: object = ByteTokenizer()
    names: tuple = ("m",)
    defaults: dict = field(default_factory=dict)


def test_a_reply_never_sends_half_a_character():
    text = ChoiceText(ByteTokenizer(), [], [], False)
    pieces = [text.add(b).text for b in "a€b日".encode()]
    assert pieces == ["a", "", "", "€", "b", "", "", "日"]
    text.add(0xE2)  # the start of a character that never comes: only the end sends it
    assert text.finish() not in ("", "\u20ac")


def test_stop_string_split_across_tokens_is_held_back_and_cut():
    text = ChoiceText(ByteTokenizer(), ["END"], [], False)
    sent = [text.add(b) for b in b"xyENDzz"[:5]]
    assert "".join(s.text for s in sent) == "xy"
    assert sent[-1].finish == "stop" and sent[-1].stop_reason == "END"
    assert text.finish() == ""  # nothing after a stop


def test_held_back_text_is_sent_at_the_end_when_no_stop_comes():
    text = ChoiceText(ByteTokenizer(), ["END"], [], False)
    sent = "".join(text.add(b).text for b in b"abcEN")
    assert sent == "abc" and text.finish() == "EN"


def test_stop_token_keeps_its_id_but_not_its_text():
    text = ChoiceText(ByteTokenizer(), [], [ord("!")], False)
    steps = [text.add(b) for b in b"hi!"]
    assert "".join(s.text for s in steps) == "hi" and steps[-1].finish == "stop" and steps[-1].stop_reason == ord("!")
    assert text.ids == list(b"hi!")


@pytest.mark.parametrize("body,word", [
    ({"prompt": "hi", "n": 0}, "'n'"), ({"prompt": "hi", "n": True}, "'n'"), ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"), ({"prompt": "hi", "seed": 2 ** 64}, "seed"), ({"prompt": "hi", "stop": [""]}, "stop"),
    ({"prompt": "hi", "stop": 5}, "stop"), ({"prompt": "hi", "logprobs": 21}, "logprobs"), ({"prompt": "hi", "logprobs": True}, "logprobs"),
    ({"prompt": [[1], "a", 3]}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [[]]}, "empty"),
    ({"prompt": "hi", "max_tokens": 63}, "context length"), ({"prompt": "hi", "stop_token_ids": [512]}, "stop_token_ids"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream"), ({"prompt": "hi", "model": 3}, "model"),
    ({"prompt": "x" * 5000}, "characters"), ({"prompt": "hi", "top_logprobs": 2}, "top_logprobs"),
])
def test_bad_completion_fields_name_themselves(body, word):
    with pytest.raises(BadRequest) as err:
        parse_completion(body, Model())
    assert word in err.value.message


@pytest.mark.parametrize("messages,word", [
    ([], "messages"), ([{"role": "user"}], "content"), ([{"role": "robot", "content": "x"}], "role"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "text"), ([{"role": "user", "content": "x", "tool_calls": []}], "tool_calls"),
    ([{"role": [], "content": "x"}], "role"),
])
def test_bad_messages_name_themselves(messages, word):
    with pytest.raises(BadRequest) as err:
        parse_chat({"messages": messages}, Model())
    assert word in err.value.message


def test_unknown_model_is_a_404():
    with pytest.raises(ApiError) as err:
        parse_completion({"prompt": "hi", "model": "other"}, Model())
    assert err.value.status == 404 and err.value.message == "The model `other` does not exist."


def test_sampled_requests_get_a_seed_and_choices_their_own():
    req = parse_completion({"prompt": ["a", "b"], "n": 2, "temperature": 1.0}, Model())
    assert req.seed is not None and req.choices == 4
    assert [req.choice_seed(i) - req.seed for i in range(3)] == [0, 1, 2]
    assert parse_completion({"prompt": "a", "temperature": 1.0, "seed": 7}, Model()).seed == 7
    assert parse_completion({"prompt": "a"}, Model()).seed is None  # greedy: nothing to replay
    top = parse_completion({"prompt": "a", "temperature": 1, "seed": 2 ** 63 - 1, "n": 2}, Model())
    assert top.choice_seed(1) == -(2 ** 63)  # wraps inside int64


def test_chat_defaults_and_parts():
    req = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                      "logprobs": True, "top_logprobs": 3}, Model())
    same = parse_chat({"messages": [{"role": "user", "content": "a\nb"}]}, Model())
    assert req.prompts == same.prompts and req.logprobs == 3 and same.logprobs is None
    assert req.max_tokens is None  # the rest of the context, as vLLM


def test_body_checks():
    assert parse_checked(b'{"a": [1, 2]}', 10) == ("ok", {"a": [1, 2]})
    assert "lone surrogate" in parse_checked(b'{"messages": [{"role": "\\ud800"}]}', 10)[1]
    assert "nested" in parse_checked(b"[" * 5000 + b"]" * 5000, 10)[1]
    assert "values" in parse_checked(b"[" + b"1," * 20 + b"1]", 10)[1]
    assert parse_checked(b'{"t": NaN}', 10)[0] == "bad"
    assert parse_checked(b"\xff\xfe", 10)[0] == "bad"


@dataclass
class Rec:
    logprob: float
    top: list


def test_logprob_shapes():
    lp = Logprobs(ByteTokenizer(), 2, False)
    recs = [Rec(-0.5, [(104, -0.5), (105, -1.5), (106, -2.0)]), Rec(float("-inf"), [(33, -0.1)])]
    comp = lp.completion([104, 105], recs, [0, 1])
    assert comp == {"tokens": ["h", "i"], "token_logprobs": [-0.5, -9999.0],
                    "top_logprobs": [{"h": -0.5, "i": -1.5}, {"!": -0.1, "i": -9999.0}], "text_offset": [0, 1]}
    chat = lp.chat([104], recs[:1])["content"][0]
    assert chat["token"] == "h" and chat["bytes"] == [104] and [t["token"] for t in chat["top_logprobs"]] == ["h", "i"]
    assert Logprobs(ByteTokenizer(), 0, True).completion([7], recs[:1], [0])["tokens"] == ["token_id:7"]


def test_generation_config_defaults_fill_fields_a_request_leaves_out():
    model = Model(defaults={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 7})
    req = parse_completion({"prompt": "a"}, model)
    assert (req.temperature, req.top_p, req.top_k, req.max_tokens) == (0.6, 0.95, 20, 7) and req.seed is not None
    req = parse_completion({"prompt": "a", "temperature": 0, "top_p": None, "max_tokens": 3}, model)
    assert (req.temperature, req.top_p, req.max_tokens) == (0.0, 0.95, 3)


def test_the_body_parser_process_starts_with_the_server_not_with_the_first_long_body():
    """Bodies over 64 KiB are parsed in a process of their own; spawning it costs ~70 ms, which the
    first long prompt waited for before warm() (on an H200 its first cut started 86 ms after its
    send, against 12-19 ms with the process already up). warm() starts that process; the first long body is then served by it, no second spawn."""
    import asyncio
    import json

    from engine.server.body import INLINE_BYTES, BodyReader

    async def go():
        r = BodyReader(1 << 24, 1 << 20, 10.0)
        assert r._pool is None
        r.warm()
        pool = r._pool
        assert pool is not None
        body = json.dumps({"prompt": list(range(30_000))})
        assert len(body) > INLINE_BYTES
        status, value = await r._parse_elsewhere(body)
        assert status == "ok" and value["prompt"][-1] == 29_999
        assert r._pool is pool and len(pool._processes) == 1
        r.close()
    asyncio.run(go())
