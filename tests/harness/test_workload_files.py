"""tfbench load's workload files: JSONL, ShareGPT and Mooncake read from small files (the examples
the project ships, and lines written here), every bad line named FILE:LINE, the format picked
from the file, and Mooncake's shared hash ids really sharing a prefix. Pure: no server."""
import json
from pathlib import Path

import pytest

from tensorfold_bench.errors import FlagError, WorkloadError
from tensorfold_bench.workload.files import MOONCAKE_BLOCK
from tensorfold_bench.workload.spec import from_flags
from tools.byte_tokenizer_dir import write_byte_tokenizer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workloads"
VOCAB = 5000


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    """A byte-level tokenizer.json: text is its UTF-8 bytes, so lengths are easy to know."""
    d = tmp_path_factory.mktemp("tok")
    write_byte_tokenizer(d, 512, 256)
    return d


def write(tmp_path: Path, name: str, lines: list) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def items(path, level: int = 0, vocab: int = VOCAB, **flags):
    spec = from_flags(dataset=str(path), **flags)
    return spec, spec.build(spec.levels[level], vocab)


# ---- JSONL ------------------------------------------------------------------------------------

def test_jsonl_prompts_text_and_ids_with_output_lengths():
    spec, w = items(EXAMPLES / "prompts.jsonl", rates=[2.0], output_len="8")
    assert spec.data.fmt == "jsonl" and not spec.timed and len(w.items) == 6
    first = w.items[0]
    assert first.prompt.startswith("Summarise") and first.output_len == 48 and first.prompt_len is None
    assert w.items[2].prompt[:3] == (301, 477, 310) and w.items[2].output_len == 16
    assert w.items[3].output_len == 8  # the line without output_len takes --output-len
    assert [i.offset for i in w.items] == sorted(i.offset for i in w.items) and w.items[0].offset == 0.0
    # the file bounds the run: --requests takes its first N
    assert [i.id for i in items(EXAMPLES / "prompts.jsonl", rates=[2.0], output_len="8", requests=3)[1].items] == \
        ["r0", "r1", "r2"]


def test_jsonl_text_becomes_ids_with_a_tokenizer(tok):
    _, w = items(EXAMPLES / "prompts.jsonl", concurrency=[2], output_len="8", tokenizer=tok)
    assert w.items[0].prompt == tuple("Summarise the difference between a closed-loop and an open-loop "
                                      "benchmark in two sentences.".encode())


def test_jsonl_with_timestamps_is_a_trace_replayed_on_them(tmp_path):
    p = write(tmp_path, "t.jsonl", [{"prompt": [300, 301], "output_len": 4, "timestamp": 5000},
                                    {"prompt": [302], "output_len": 2, "timestamp": 5250},
                                    {"prompt": [303], "output_len": 2, "timestamp": 7000}])
    spec, w = items(p, time_scale=2.0)
    assert spec.timed and [lv.label for lv in spec.levels] == ["trace x 2"]
    assert [i.offset for i in w.items] == [0.0, 0.5, 4.0] and w.timed
    assert [i.offset for i in items(p)[1].items] == [0.0, 0.25, 2.0]
    assert [i.offset for i in items(p, duration=1.0)[1].items] == [0.0, 0.25]
    assert all(i.offset is None for i in items(p, concurrency=[2])[1].items)  # played closed-loop


@pytest.mark.parametrize("line,match", [
    ("{not json", r"bad\.jsonl:2: not JSON"),
    ("[1, 2]", r"bad\.jsonl:2: expected a JSON object"),
    ('{"text": "hi"}', r"bad\.jsonl:2: no prompt"),
    ('{"prompt": 5, "output_len": 3}', r"bad\.jsonl:2: prompt must be text or a list of token ids"),
    ('{"prompt": [1, -2], "output_len": 3}', r"bad\.jsonl:2: prompt as a list must hold token ids"),
    ('{"prompt": [], "output_len": 3}', r"bad\.jsonl:2: prompt"),
    ('{"prompt": "hi", "output_len": 0}', r"bad\.jsonl:2: output_len must be a whole number, at least 1"),
    ('{"prompt": "hi", "output_len": 3, "timestamp": 10}', r"bad\.jsonl:2: timestamp: this line has one"),
])
def test_a_bad_jsonl_line_is_named_by_file_and_line(tmp_path, line, match):
    p = write(tmp_path, "bad.jsonl", ['{"prompt": "fine", "output_len": 2}', line])
    with pytest.raises(WorkloadError, match=match) as e:
        from_flags(dataset=str(p), rates=[1.0])
    assert str(e.value).startswith(f"{p}:2: ") and "\n" not in str(e.value)


def test_jsonl_without_output_len_needs_the_flag_and_ids_must_fit_the_vocabulary(tmp_path):
    p = write(tmp_path, "a.jsonl", ['{"prompt": "a", "output_len": 2}', "", '{"prompt": [400, 9000]}'])
    with pytest.raises(FlagError, match=rf"^--output-len: {p}:3 gives no output_len"):
        from_flags(dataset=str(p), rates=[1.0])
    spec = from_flags(dataset=str(p), rates=[1.0], output_len="4")
    with pytest.raises(WorkloadError, match=rf"^{p}:3: token id 9000 is outside the server's vocabulary of 5,000"):
        spec.build(spec.levels[0], VOCAB)
    assert spec.build(spec.levels[0], 10_000).items[1].prompt == (400, 9000)


def test_timestamps_going_back_are_named(tmp_path):
    p = write(tmp_path, "b.jsonl", [{"prompt": "a", "output_len": 1, "timestamp": 10},
                                    {"prompt": "b", "output_len": 1, "timestamp": 20},
                                    {"prompt": "c", "output_len": 1, "timestamp": 15}])
    with pytest.raises(WorkloadError, match=rf"^{p}:3: timestamp 15 goes back in time \(line 2 has 20\)"):
        from_flags(dataset=str(p))


# ---- ShareGPT ---------------------------------------------------------------------------------

def test_sharegpt_first_turns_by_default_sessions_with_turns(tok):
    spec, w = items(EXAMPLES / "sharegpt-5.json", rates=[1.0], tokenizer=tok)
    assert spec.data.fmt == "sharegpt" and spec.data.skipped == 1  # c3: no reply
    assert [i.id for i in w.items] == ["r0", "r1", "r2", "r3"]
    assert w.items[0].prompt == tuple(b"What is a KV cache?")
    assert w.items[0].output_len == len(b"The keys and values of every token an attention layer has seen, kept so "
                                        b"that each new token attends to them without recomputing them.")
    assert w.items[1].prompt == tuple(b"Name one way to schedule prefill.")  # the system message is skipped
    assert w.items[2].prompt == tuple(b"Tell me what a lane is.")  # a leading reply is skipped
    spec, w = items(EXAMPLES / "sharegpt-5.json", rates=[1.0], tokenizer=tok, turns=3, think=2.0)
    c2 = [i for i in w.items if i.session == "s2"]
    assert [(i.id, i.prompt, i.offset is None, i.think) for i in c2] == [
        ("s2.t0", tuple(b"Tell me what a lane is."), False, 0.0), ("s2.t1", tuple(b"And a cut?"), True, 2.0),
        ("s2.t2", tuple(b"Thanks."), True, 2.0)]
    assert [i.output_len for i in c2] == [len(b"A slot of the batch with its own region of the cache."),
                                          len(b"A fixed-size piece of a prompt, run as one step."),
                                          len(b"You are welcome.")]
    assert len([i for i in w.items if i.session == "s0"]) == 2 and len([i for i in w.items if i.session == "s1"]) == 1


def test_sharegpt_text_needs_a_tokenizer_unless_lengths_are_given(tmp_path):
    with pytest.raises(FlagError, match=r"^--tokenizer: .*sharegpt-5\.json:2: a text reply's length is counted"):
        from_flags(dataset=str(EXAMPLES / "sharegpt-5.json"), rates=[1.0])
    _, w = items(EXAMPLES / "sharegpt-5.json", rates=[1.0], output_len="16")
    assert w.items[0].prompt == "What is a KV cache?" and w.items[0].output_len == 16  # sent as text
    with pytest.raises(FlagError, match=r"^--tokenizer: .*:2: multi-turn sessions"):
        from_flags(dataset=str(EXAMPLES / "sharegpt-5.json"), rates=[1.0], output_len="16", turns=2)
    with pytest.raises(FlagError, match=rf"^--tokenizer: {tmp_path}: no tokenizer.json"):
        from_flags(dataset=str(EXAMPLES / "sharegpt-5.json"), rates=[1.0], tokenizer=tmp_path)


def test_sharegpt_token_ids_need_no_tokenizer_and_an_object_a_line_reads_too(tmp_path):
    conv = {"conversations": [{"from": "human", "value": [300, 301, 302]}, {"from": "gpt", "value": [5] * 7}]}
    p = write(tmp_path, "ids.jsonl", [conv, conv])
    spec, w = items(p, concurrency=[1])
    assert spec.data.fmt == "sharegpt" and [(i.prompt, i.output_len) for i in w.items] == [((300, 301, 302), 7)] * 2


def test_sharegpt_turns_end_where_the_alternation_does(tmp_path):
    h, g = (lambda v: {"from": "human", "value": v}), (lambda v: {"from": "gpt", "value": v})
    convs = [[h([300]), g([1]), {"from": "robot", "value": "x"}, h([301]), g([1])],  # an unknown role
             [h([302]), g([1, 1]), h([]), g([1])],  # an empty message
             [h([303]), h([304]), g([1])],  # two humans in a row
             [{"from": "robot", "value": "x"}]]  # nothing to send: skipped
    p = write(tmp_path, "alt.jsonl", [{"conversations": c} for c in convs])
    spec, w = items(p, concurrency=[1], turns=3)
    assert [(i.id, i.prompt) for i in w.items] == [("s0.t0", (300,)), ("s1.t0", (302,))]
    assert spec.data.skipped == 2


def test_only_what_a_level_can_send_is_tokenized_but_every_entry_is_checked(tmp_path, tok):
    conv = lambda q: {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "ok"}]}
    p = write(tmp_path, "many.jsonl", [conv(f"question {k}") for k in range(50)])
    spec = from_flags(dataset=str(p), rates=[1.0], tokenizer=tok, requests=3)
    assert len(spec.data.records) == 3 and "(50 conversations, the first 3 read)" in spec.describe()
    assert [i.prompt for i in spec.build(spec.levels[0], 512).items] == [tuple(f"question {k}".encode()) for k in range(3)]
    spec = from_flags(dataset=str(p), rates=[1.0, 2.0], tokenizer=tok, duration=5.0, arrival="constant")
    assert len(spec.data.records) == 10  # 2/s for 5 s
    assert len(from_flags(dataset=str(p), concurrency=[2], tokenizer=tok).data.records) == 50
    p = write(tmp_path, "badlate.jsonl", [conv("a"), conv("b"), {"conversation": []}])
    with pytest.raises(WorkloadError, match=r"badlate\.jsonl:3: expected"):
        from_flags(dataset=str(p), rates=[1.0], tokenizer=tok, requests=1)
    p = write(tmp_path, "late.jsonl", [{"prompt": "a", "output_len": 1}, {"prompt": "b", "output_len": 1},
                                       {"prompt": "c", "output_len": 0}])
    with pytest.raises(WorkloadError, match=r"late\.jsonl:3: output_len"):
        from_flags(dataset=str(p), rates=[1.0], tokenizer=tok, requests=1)


def test_a_bad_sharegpt_entry_is_named_by_its_line(tmp_path):
    good = '  {"conversations": [{"from": "human", "value": [300]}, {"from": "gpt", "value": [1]}]}'
    cases = [('  {"conversation": []}', r":3: expected \{\"conversations\""),
             ('  {"conversations": [{"from": "human"}]}', r":3: conversations\[0\] must have \"from\" and \"value\""),
             ('  {"conversations": [}', r":3: not JSON")]
    for entry, match in cases:
        p = tmp_path / "bad.json"
        p.write_text("[\n" + good + ",\n" + entry + "\n]\n")
        with pytest.raises(WorkloadError, match=match) as e:
            from_flags(dataset=str(p), rates=[1.0])
        assert str(e.value).startswith(f"{p}:3: ")
    p.write_text("[\n" + good + "\n" + good + "\n]\n")
    with pytest.raises(WorkloadError, match=rf"^{p}:3: expected ',' or '\]'"):
        from_flags(dataset=str(p), rates=[1.0])


# ---- Mooncake ---------------------------------------------------------------------------------

def test_mooncake_replays_on_its_timestamps_with_its_lengths():
    path = EXAMPLES / "mooncake-40.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    spec, w = items(path)
    assert spec.data.fmt == "mooncake" and spec.timed and len(rows) == len(w.items) == 40
    assert [lv.label for lv in spec.levels] == ["trace x 1"]
    for r, i in zip(rows, w.items):
        assert i.offset == pytest.approx((r["timestamp"] - rows[0]["timestamp"]) / 1000)
        assert i.prompt_len == r["input_length"] and i.output_len == r["output_length"]
        assert i.hash_ids == tuple(r["hash_ids"])
    half = items(path, time_scale=0.5)[1]
    assert [i.offset for i in half.items] == pytest.approx([i.offset / 2 for i in w.items])
    assert items(path)[1] == w  # the same requests in every run


def test_mooncake_shared_hash_ids_share_a_prefix_and_only_those():
    _, w = items(EXAMPLES / "mooncake-40.jsonl")
    blocks: dict[int, tuple] = {}
    pairs = 0
    for i in w.items:
        for k, h in enumerate(i.hash_ids):
            block = i.prompt[k * MOONCAKE_BLOCK:(k + 1) * MOONCAKE_BLOCK]
            if h in blocks and len(block) == MOONCAKE_BLOCK:
                assert block == blocks[h]  # the same id is the same 512 tokens in every item
                pairs += 1
            elif len(block) == MOONCAKE_BLOCK:
                blocks[h] = block
    assert pairs > 20
    assert len({b for b in blocks.values()}) == len(blocks)  # distinct ids, distinct tokens
    a = w.items[0]
    b = next(i for i in w.items if not set(i.hash_ids) & set(a.hash_ids))  # nothing shared
    assert a.prompt[:16] != b.prompt[:16]
    c = next(i for i in w.items[1:] if i.hash_ids[0] == a.hash_ids[0])  # the same first block
    assert a.prompt[:MOONCAKE_BLOCK] == c.prompt[:MOONCAKE_BLOCK] and a.prompt[MOONCAKE_BLOCK:] != c.prompt[MOONCAKE_BLOCK:]


@pytest.mark.parametrize("row,match", [
    ({"timestamp": 1, "input_length": 10, "output_length": 2}, r":2: no hash_ids \(a Mooncake line has"),
    ({"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [4]},
     r":2: input_length 600 is more than its 1 hash ids of 512 tokens hold \(512\)"),
    ({"timestamp": 1, "input_length": 10, "output_length": 0, "hash_ids": [4]}, r":2: output_length must be"),
    ({"timestamp": -1, "input_length": 10, "output_length": 2, "hash_ids": [4]}, r":2: timestamp must be"),
    ({"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": "4"}, r":2: hash_ids must be a list"),
])
def test_a_bad_mooncake_line_is_named(tmp_path, row, match):
    p = write(tmp_path, "m.jsonl", [{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}, row])
    with pytest.raises(WorkloadError, match=match) as e:
        from_flags(dataset=str(p))
    assert str(e.value).startswith(f"{p}:2: ")


def test_mooncake_flags_that_do_not_apply_are_refused():
    path = str(EXAMPLES / "mooncake-40.jsonl")
    with pytest.raises(FlagError, match=r"^--rate: .*timed trace"):
        from_flags(dataset=path, rates=[1.0])
    with pytest.raises(FlagError, match=r"^--input-len: "):
        from_flags(dataset=path, input_len="20")
    with pytest.raises(FlagError, match=r"^--turns: "):
        from_flags(dataset=path, turns=2)
    with pytest.raises(FlagError, match=r"^--output-len: .*output_length"):
        from_flags(dataset=path, output_len="8")


# ---- picking the format -----------------------------------------------------------------------

def test_auto_picks_each_format_and_an_explicit_one_wins(tmp_path, tok):
    assert from_flags(dataset=str(EXAMPLES / "mooncake-40.jsonl")).data.fmt == "mooncake"
    assert from_flags(dataset=str(EXAMPLES / "prompts.jsonl"), rates=[1.0], output_len="2").data.fmt == "jsonl"
    assert from_flags(dataset=str(EXAMPLES / "sharegpt-5.json"), rates=[1.0], tokenizer=tok).data.fmt == "sharegpt"
    with pytest.raises(WorkloadError, match=r"mooncake-40\.jsonl:1: no prompt"):
        from_flags(dataset=str(EXAMPLES / "mooncake-40.jsonl"), fmt="jsonl", rates=[1.0])


def test_a_file_that_matches_no_format_or_is_missing_is_one_line(tmp_path):
    p = write(tmp_path, "odd.csv", ["a,b,c", "1,2,3"])
    with pytest.raises(FlagError, match=rf"^--format: {p}: a \.csv file that matches none of jsonl"):
        from_flags(dataset=str(p), rates=[1.0])
    p = write(tmp_path, "lists.jsonl", ["[300, 301]", "[302]"])
    with pytest.raises(FlagError, match=r"^--format: .*lists\.jsonl: a \.jsonl file that matches none"):
        from_flags(dataset=str(p), rates=[1.0])
    p = write(tmp_path, "odd.jsonl", [{"question": "x"}])
    with pytest.raises(FlagError, match=r"^--format: .*odd\.jsonl"):
        from_flags(dataset=str(p), rates=[1.0])
    with pytest.raises(FlagError, match=r"^--dataset: .*nothing\.jsonl: no such file"):
        from_flags(dataset=str(tmp_path / "nothing.jsonl"), rates=[1.0])
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(FlagError, match=r"^--dataset: .*empty"):
        from_flags(dataset=str(tmp_path / "empty.jsonl"), rates=[1.0])


def test_a_missing_tokenizers_package_names_the_extra(tok, no_tokenizers):
    with pytest.raises(FlagError, match=r"^--tokenizer: .*'tokenizers' package.*\[engine\] extra"):
        from_flags(dataset=str(EXAMPLES / "sharegpt-5.json"), rates=[1.0], tokenizer=tok)


def test_warmup_and_injects_with_a_trace():
    spec, w = items(EXAMPLES / "mooncake-40.jsonl", warmup=5, inject="2000@10")
    load = [i for i in w.items if i.kind == "load"]
    assert [i.warmup for i in load] == [True] * 5 + [False] * 35
    inj = [i for i in w.items if i.kind == "inject"]
    assert [i.offset for i in inj] == [10.0, 20.0, 30.0, 40.0, 50.0] and all(i.prompt_len == 2000 for i in inj)
    with pytest.raises(FlagError, match=r"^--warmup: 40 warm-up requests leave none of the 40"):
        from_flags(dataset=str(EXAMPLES / "mooncake-40.jsonl"), warmup=40)


# ---- text without --tokenizer ------------------------------------------------------------------

def test_a_launched_presets_own_tokenizer_counts_text_and_the_receipt_says_so(tok):
    """No --tokenizer: the preset's own (byte-level) tokenizer makes the ids and counts the
    replies, as --tokenizer with the byte-level directory did, and the description names it."""
    from tensorfold_bench.workload import readers
    spec, w = items(EXAMPLES / "sharegpt-5.json", rates=[1.0], fallback=readers.counter_for(None, "tiny"))
    assert w.items[0].prompt == tuple(b"What is a KV cache?")
    assert w.items[0].output_len == len(b"The keys and values of every token an attention layer has seen, kept so "
                                        b"that each new token attends to them without recomputing them.")
    assert "text counted by tfengine's byte-level tokenizer (preset tiny)" in spec.describe()
    # --tokenizer, when given, is what counts
    given = from_flags(dataset=str(EXAMPLES / "sharegpt-5.json"), rates=[1.0], fallback=readers.counter_for(None, "tiny"),
                       tokenizer=tok)
    assert given.data.counted_by == f"the tokenizer.json of --tokenizer {tok}"


class _Tokenize:
    """A server whose /tokenize answers (ids: the text's bytes plus 1000) or is missing (404)."""

    def __init__(self, has: bool):
        import http.server
        import threading
        has_route = has

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not has_route or self.path != "/tokenize":
                    out, code = {"error": {"message": "no route"}}, 404
                else:
                    out, code = {"tokens": [b + 1000 for b in body["prompt"].encode()]}, 200
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def __enter__(self):
        return self.url

    def __exit__(self, *exc):
        self.srv.shutdown()


def test_a_running_servers_tokenize_counts_text_and_one_without_it_gets_the_clear_error():
    from tensorfold_bench.workload import readers
    with _Tokenize(True) as url:
        spec, w = items(EXAMPLES / "sharegpt-5.json", rates=[1.0], fallback=readers.counter_for(f"srv={url}", None))
    assert w.items[0].prompt == tuple(b + 1000 for b in b"What is a KV cache?")
    assert f"text counted by the server's /tokenize ({url})" in spec.describe()
    with _Tokenize(False) as url:
        with pytest.raises(FlagError, match=r"^--tokenizer: .*/tokenize: the server cannot count text tokens "
                                            r"\(HTTP 404\): give --tokenizer DIR"):
            from_flags(dataset=str(EXAMPLES / "sharegpt-5.json"), rates=[1.0], fallback=readers.counter_for(url, None))
