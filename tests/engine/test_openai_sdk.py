"""The `openai` Python SDK, unmodified, against the engine served for real on loopback."""
import pytest

from tensorfold_bench.servers.launcher import launch

openai = pytest.importorskip("openai")

FLAGS = ["--model", "tiny", "--parallel", "4", "--max-model-len", "512", "--prefill-rows", "8"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with launch(FLAGS, tmp_path_factory.mktemp("sdk") / "server.log") as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60) as c:
            yield c


def test_models(client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("nope")
    assert "does not exist" in err.value.message


def test_completions_plain_and_streamed(client):
    done = client.completions.create(model="tiny", prompt="hello", max_tokens=8, extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 8 and done.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model="tiny", prompt="hello", max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_chat_plain_and_streamed(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    done = client.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=6,
                                          extra_body={"ignore_eos": True})
    assert done.choices[0].message.role == "assistant" and done.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 6


def test_n_and_prompt_lists_and_stop(client):
    r = client.completions.create(model="tiny", prompt=["ab", "cd"], n=2, max_tokens=4, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy: the same reply twice
    one = client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=20, extra_body={"ignore_eos": True})
    ids = one.choices[0].model_extra["token_ids"]
    stop = client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=20,
                                     extra_body={"ignore_eos": True, "stop_token_ids": [ids[2]]})
    assert stop.choices[0].finish_reason == "stop" and len(stop.choices[0].model_extra["token_ids"]) <= 3


def test_errors_are_openai_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="x", max_tokens=1, extra_body={"frobnicate": 1})
    assert "frobnicate" in err.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=10 ** 6)


def test_sampling_and_logprobs(client):
    pytest.importorskip("engine.scheduler.sampling")
    a = client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=1.0, seed=4, logprobs=2,
                                  extra_body={"ignore_eos": True})
    b = client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=1.0, seed=4,
                                  extra_body={"ignore_eos": True})
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]
    assert len(a.choices[0].logprobs.token_logprobs) == 8
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert len(chat.choices[0].logprobs.content) == 4
    assert all(len(t.top_logprobs) == 2 for t in chat.choices[0].logprobs.content)
