"""The streaming client against servers that are not tfengine (the foreign stand-in, real HTTP on
loopback): token ids when asked with return_token_ids, logprobs only on the logprobs route, chunk
counts with usage, and unknown (never mismatched) ids, cached tokens and fingerprints."""
import asyncio
import sys

import pytest

from tensorfold_bench.client.stream import Request, StreamClient, StreamRecord, new_record, stream
from tensorfold_bench.servers.launcher import launch

import fakeserver
import foreignserver
from fakeserver import token_for
from foreignserver import REFUSAL

PROMPT = [11, 12, 13, 14, 15]
N = 7


def expected(prompt=PROMPT, n=N):
    out = []
    for _ in range(n):
        out.append(token_for(prompt, out))
    return out


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One server per behaviour, launched as `command:` servers are."""
    log = tmp_path_factory.mktemp("servers")
    kinds = {"vllm-like": [], "text-only": ["--ids", "never", "--tokens-per-chunk", "3"],
             "logprobs-ids": ["--ids", "never", "--logprobs", "ids"],
             "cached": ["--cached-tokens", "--fingerprint", "fp-1"]}
    from contextlib import ExitStack
    with ExitStack() as stack:
        urls = {k: stack.enter_context(launch(log=log / f"{k}.log", command=[
            *foreignserver.CMD, "serve", "--port", "{port}", *flags])).url
            for k, flags in kinds.items()}
        urls["tfengine-like"] = stack.enter_context(launch([], log / "fake.log", engine_cmd=fakeserver.CMD)).url
        yield urls


def play(url: str, req: Request) -> StreamRecord:
    async def go():
        async with StreamClient() as client:
            rec = await stream(client, url, req, new_record(req), model="tiny")
        return rec
    return asyncio.run(go())


def test_ids_come_when_asked_and_logprobs_is_never_sent(servers):
    rec = play(servers["vllm-like"], Request("B", PROMPT, max_tokens=N))
    assert rec.error is None  # the stand-in refuses any request carrying logprobs, as vLLM did
    assert rec.counted_by == "ids" and rec.known_ids == expected() and rec.tokens == N
    assert rec.server_sha is None and rec.cached_tokens is None and rec.system_fingerprint is None
    assert rec.usage["completion_tokens"] == N and len(rec.token_times) == N


def test_the_logprobs_route_is_the_only_one_sending_logprobs(servers):
    refused = play(servers["vllm-like"], Request("B", PROMPT, max_tokens=N, token_ids="logprobs"))
    assert refused.error == f"HTTP 400: {REFUSAL}" and refused.tokens == 0
    rec = play(servers["logprobs-ids"], Request("B", PROMPT, max_tokens=N, token_ids="logprobs"))
    assert rec.error is None and rec.counted_by == "logprobs" and rec.known_ids == expected()


def test_text_chunks_only_count_by_chunks_and_the_hash_is_unknown(servers):
    rec = play(servers["text-only"], Request("B", PROMPT, max_tokens=N))
    assert rec.counted_by == "chunks" and rec.known_ids is None
    assert len(rec.token_ids) == 3 and rec.token_ids == [None] * 3  # 7 tokens in chunks of 3
    assert rec.tokens == N  # usage.completion_tokens wins over the chunk count
    no_usage = play(servers["text-only"], Request("B", PROMPT, max_tokens=N,
                                                   extra={"stream_options": {"include_usage": False}}))
    assert no_usage.usage is None and no_usage.counted_by == "chunks" and no_usage.tokens == 3


def test_chunks_route_asks_for_nothing(servers):
    rec = play(servers["vllm-like"], Request("B", PROMPT, max_tokens=N, token_ids="chunks"))
    assert rec.counted_by == "chunks" and rec.known_ids is None and rec.tokens == N


def test_cached_tokens_and_fingerprint_when_reported(servers):
    prompt = [21, 22, 23, 24]
    first = play(servers["cached"], Request("B", prompt, max_tokens=2))
    again = play(servers["cached"], Request("B", prompt, max_tokens=2))
    assert first.cached_tokens == 0 and again.cached_tokens == len(prompt) - 1
    assert again.system_fingerprint == "fp-1"


def test_chat_on_a_foreign_server(servers):
    rec = play(servers["vllm-like"], Request("C", messages=[{"role": "user", "content": "hi"}], max_tokens=3))
    assert rec.error is None and rec.counted_by == "ids" and len(rec.known_ids) == 3


def test_tfengine_like_server_gives_ids_hash_and_cache(servers):
    rec = play(servers["tfengine-like"], Request("B", PROMPT, max_tokens=N))
    assert rec.counted_by == "ids" and rec.known_ids == expected()
    assert rec.server_sha and rec.cached_tokens == 0


def test_an_unreachable_server_is_a_stream_error_not_a_crash():
    from tensorfold_bench.servers.launcher import free_port
    rec = play(f"http://127.0.0.1:{free_port()}", Request("B", PROMPT, max_tokens=2))
    assert rec.error.startswith("ConnectError") and rec.tokens == 0 and rec.ended is not None


def test_old_receipt_records_still_load():
    old = {"name": "A", "path": "/v1/completions", "prompt_len": 3, "max_tokens": 2, "token_ids": [1, 2],
           "token_times": [0.1, 0.2], "some_future_field": 1}
    rec = StreamRecord.from_dict(old)
    assert rec.counted_by is None and rec.cached_tokens is None and rec.known_ids == [1, 2] and rec.tokens == 2


def test_an_unknown_token_id_route_is_refused():
    with pytest.raises(ValueError, match="token_ids must be one of"):
        Request("B", PROMPT, token_ids="bogus").body("m")
