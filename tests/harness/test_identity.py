"""Asking a server what it is (tfengine stand-in, foreign stand-in, real HTTP on loopback), and
finding the vocabulary for random prompts from the server or a directory."""
import json
import sys

import pytest

from tensorfold_bench.errors import BenchError
from tensorfold_bench.servers.identity import ServerIdentity, discover_vocab, identify, identity_of, vocab_from_dir
from tensorfold_bench.servers.launcher import free_port, launch

import fakeserver
import foreignserver
from fakeserver import VOCAB
from foreignserver import VERSION


def hf_dir(path, vocab=8192, tokenizer_ids=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab}))
    if tokenizer_ids is not None:
        (path / "tokenizer.json").write_text(json.dumps({
            "model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(tokenizer_ids)}},
            "added_tokens": [{"id": tokenizer_ids + 2, "content": "<|end|>"}]}))
    return path


def test_a_foreign_server_is_named_by_itself(tmp_path):
    model = hf_dir(tmp_path / "qwen3-random", vocab=8192)
    cmd = [*foreignserver.CMD, "serve", "--port", "{port}",
           "--model", "random-qwen3", "--root", str(model)]
    with launch(log=tmp_path / "f.log", command=cmd) as srv:
        ident = identify(srv.url, srv)
    assert (ident.name, ident.version, ident.model, ident.owned_by) == ("standin", VERSION, "random-qwen3", "standin")
    assert ident.root == str(model) and ident.max_model_len == 4096 and ident.vocab_size is None
    assert ident.launched and ident.command == srv.command_line and ident.engine is None
    assert any("launched group" in c for c in ident.checked)
    assert ident.label == f"standin {VERSION}, model random-qwen3"
    assert discover_vocab(ident) == 8192  # from the root directory the server names
    assert json.loads(json.dumps(ident.to_dict()))["name"] == "standin"


def test_a_tfengine_is_named_with_its_engine_facts(tmp_path):
    with launch(["--model", "tiny"], tmp_path / "e.log",
                engine_cmd=fakeserver.CMD) as srv:
        ident = identify(srv.url, srv)
    assert ident.name == "tfengine" and ident.model == "tiny" and ident.engine["nonce"] == srv.nonce
    assert ident.vocab_size == VOCAB and discover_vocab(ident) == VOCAB
    assert "--model tiny" in ident.command


def test_each_fact_has_one_answer_the_models_list_first_then_tfengines_own():
    engine = {"engine": {"max_model_len": 2048, "shape": {"vocab": 512}}, "config": {"max_model_len": 1024},
              "commit": "abc"}
    bare = identity_of("http://x", {"object": "list", "data": [{"id": "m"}]}, None, engine)
    assert (bare.name, bare.model, bare.max_model_len, bare.vocab_size, bare.version) == ("tfengine", "m", 2048, 512,
                                                                                           "abc")
    listed = {"data": [{"id": "m", "max_model_len": 4096, "vocab_size": 1000}]}
    told = identity_of("http://x", listed, None, engine)
    assert (told.max_model_len, told.vocab_size) == (4096, 1000)
    assert told.answers == {"engine": engine, "models": listed} and "answers" not in told.to_dict()
    silent = identity_of("http://x", None, None, None)
    assert (silent.name, silent.request_model, silent.max_model_len, silent.answers) == (
        "unknown", "default", None, {"engine": None, "models": None})


def test_identify_unreachable_is_one_line():
    with pytest.raises(BenchError, match="cannot reach the server") as e:
        identify(f"http://127.0.0.1:{free_port()}")
    assert "\n" not in str(e.value)


def test_vocab_from_directories(tmp_path):
    assert vocab_from_dir(hf_dir(tmp_path / "a", vocab=151936, tokenizer_ids=151000)) == 151003
    assert vocab_from_dir(hf_dir(tmp_path / "b", vocab=512)) == 512
    foreign = ServerIdentity(url="http://x", name="vllm")
    assert discover_vocab(foreign, tokenizer=tmp_path / "b") == 512
    assert discover_vocab(foreign, model_dir=tmp_path / "a") == 151003
    with pytest.raises(BenchError) as e:
        discover_vocab(foreign)
    assert "--vocab N" in str(e.value) and "--tokenizer DIR" in str(e.value) and "http://x" in str(e.value)
    with pytest.raises(BenchError, match="--tokenizer .*: not a directory"):
        discover_vocab(foreign, tokenizer=tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchError, match="no vocab_size in config.json"):
        discover_vocab(foreign, tokenizer=tmp_path / "empty")
