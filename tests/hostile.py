"""Hostile clients, shared by the reliability tests and scripts/reliability.py: seeded fuzzed
request bodies, and a client that disconnects at a chosen point of its stream."""
import asyncio
import json
import random

VALUES = [None, True, False, 0, -1, 1, 3, 2 ** 70, -(2 ** 70), 1.5, -0.5, 1e308, "", "x", "\ud800", "a\udc00b",
          "foreground", "background", [], {}, [1, 2], [[1, 2]], ["a", "b"], [True], {"a": 1}, {"include_usage": True},
          {"type": "text"}, [{"type": "text", "text": "hi"}], [{"role": "user", "content": "hi"}],
          [{"role": "\ud800", "content": "hi"}], [{"role": "user", "content": ["x"]}], [10 ** 6], [-1], "9" * 5000]
FIELDS = ["prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "temperature",
          "top_p", "top_k", "seed", "n", "stop", "stop_token_ids", "logprobs", "top_logprobs", "priority", "draft",
          "ignore_eos", "model", "user", "echo", "presence_penalty", "best_of", "suffix", "tools", "unknown_field",
          "return_tokens_as_token_ids", "include_stop_str_in_output"]
PATHS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]


def fuzz_case(rng: random.Random) -> tuple[str, str, bytes, dict]:
    path = rng.choice(PATHS)
    headers = {"Content-Type": "application/json"}
    kind = rng.random()
    base = ({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else
            {"tokens": [1, 2]} if "detok" in path else {"prompt": [1, 2, 3]})
    base |= {"max_tokens": 2} if "tokenize" not in path else {}
    if kind < 0.08:
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    elif kind < 0.14:
        depth = rng.choice([30, 65, 900, 3000])
        body = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    elif kind < 0.2:
        body = json.dumps(base).encode()[: rng.randrange(1, 20)]
    elif kind < 0.26:
        body = json.dumps(base).encode()
        headers["Content-Type"] = rng.choice(["application/json; charset=foo", "application/json; charset=latin-1",
                                              "text/plain", "application/json; charset=utf-16", ""])
        if "utf-16" in headers["Content-Type"] and rng.random() < 0.5:
            body = json.dumps(base).encode("utf-16")
    elif kind < 0.3:
        body = rng.choice([b"[]", b"null", b"1", b'"s"', b"NaN", b'{"prompt": NaN}', b'{"max_tokens": Infinity}', b""])
    else:
        obj = dict(base)
        for _ in range(rng.randrange(1, 4)):
            obj[rng.choice(FIELDS)] = rng.choice(VALUES)
        if isinstance(obj.get("n"), int) and obj.get("stream") is True:
            obj["n"] = min(obj["n"], 3)
        body = json.dumps(obj).encode()
    method = "POST" if rng.random() < 0.97 else rng.choice(["GET", "PUT", "DELETE"])
    return method, path, body, headers


async def request_then_close(url: str, body: dict, read_events: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps({**body, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    await writer.drain()
    seen = 0
    if read_events >= 0:
        await reader.readuntil(b"\r\n\r\n")  # the headers: the stream has started
        while seen < read_events:
            line = await reader.readline()
            seen += line.startswith(b"data: ")
    writer.transport.abort()  # a reset, as a killed client would
