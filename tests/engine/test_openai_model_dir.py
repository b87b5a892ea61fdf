"""The HTTP layer over a real Hugging Face directory (transformers' own save_pretrained, a
byte-level BPE tokenizer.json, a ChatML template, generation_config.json sampling defaults),
driven by the openai SDK."""
import asyncio

import httpx
import pytest

from tensorfold_bench.servers.launcher import launch
from tests.openai_helpers import sse_events

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tools.make_model_dir import make_model_dir
    d = make_model_dir(tmp_path_factory.mktemp("hf") / "model", seed=0)
    flags = ["--model", str(d), "--load-format", "safetensors", "--parallel", "2", "--max-model-len", "256",
             "--prefill-rows", "8"]
    with launch(flags, tmp_path_factory.mktemp("hfsrv") / "server.log") as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60) as client:
            yield srv.url, client, d.resolve()


def test_models_root_is_the_directory(served):
    url, client, d = served
    entry = client.models.list().data[0]
    assert entry.model_extra["root"] == str(d)
    assert client.models.retrieve(str(d)).id == entry.id
    r = client.completions.create(model=str(d), prompt="hello", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_generation_config_defaults_sample_and_report_a_seed(served):
    url, client, _ = served
    body = {"prompt": "the quick brown fox", "max_tokens": 12, "ignore_eos": True}
    sampled = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    assert isinstance(sampled["seed"], int)  # generation_config.json: temperature 0.6
    again = httpx.post(url + "/v1/completions", json={**body, "seed": sampled["seed"]}, timeout=60).json()
    assert again["choices"][0]["token_ids"] == sampled["choices"][0]["token_ids"]
    greedy = httpx.post(url + "/v1/completions", json={**body, "temperature": 0}, timeout=60).json()
    assert "seed" not in greedy


def test_chat_through_the_template_streamed_equals_whole(served):
    url, client, _ = served
    msgs = [{"role": "user", "content": [{"type": "text", "text": "naïve café 日本"}]}]
    whole = client.chat.completions.create(model=client.models.list().data[0].id, messages=msgs, max_tokens=16,
                                           temperature=0, extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model=client.models.list().data[0].id, messages=msgs, max_tokens=16,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 16


def test_a_template_refusal_is_a_400(served):
    url, client, _ = served
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=2,
                                       messages=[{"role": "developer", "content": "x"}])
    assert "developer" in err.value.message


def test_stop_string_on_tokenizer_text(served):
    url, _, _ = served
    body = {"prompt": "the lazy dog", "max_tokens": 30, "ignore_eos": True, "temperature": 0}
    text = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    visible = [ch for ch in text.strip() if not ch.isspace()]
    assert visible, text
    stop = visible[len(visible) // 2]
    cut = httpx.post(url + "/v1/completions", json={**body, "stop": [stop]}, timeout=60).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.index(stop)]
    events = asyncio.run(sse_events(url, {**body, "stop": [stop]}))
    assert "".join(e["choices"][0]["text"] for e in events) == cut["text"]


def test_tokenize_detokenize_round_trip(served):
    url, _, _ = served
    text = "naïve café — 日本"
    tokens = httpx.post(url + "/tokenize", json={"prompt": text}).json()["tokens"]
    assert httpx.post(url + "/detokenize", json={"tokens": tokens}).json()["prompt"] == text
