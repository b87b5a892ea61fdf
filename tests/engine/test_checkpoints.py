"""Checkpoints written by transformers' own save_pretrained (random weights, tiny shapes) serve the
same greedy ids as transformers' generate and the same logits; config.json as transformers 4.x
and 5.x write it reads the same; what the model does not implement is refused in one line."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config import ConfigError, EngineConfig, KernelConfig, ModelConfig
from tools.make_model_dir import make_model_dir
from engine.models.hf_config import from_hf_dict
from engine.models.presets import PRESETS, resolve_model
from engine.runner.build import build_runner

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "the engine streams tokens 🙂 to every client"}]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """plain (one file), tied, and sharded with an index: each a different random model."""
    base = tmp_path_factory.mktemp("hf")
    return {"plain": make_model_dir(base / "plain", seed=1),
            "tied": make_model_dir(base / "tied", seed=2, tie=True),
            "sharded": make_model_dir(base / "sharded", seed=3, shard_kb=40)}


def _runner(path, wide=None):
    return build_runner(EngineConfig(model=str(path), load_format="safetensors", parallel=2,
                                     max_model_len=256, prefill_rows=16, kernels=KernelConfig(cpu_wide=wide)))


@pytest.mark.parametrize("wide", [None, False])  # the CPU's default; float32 weights through MKL
@pytest.mark.parametrize("kind", ["plain", "tied", "sharded"])
def test_greedy_ids_and_logits_match_transformers(dirs, kind, wide):
    path = dirs[kind]
    if kind == "sharded":
        assert len(list(path.glob("model-*.safetensors"))) > 1 and (path / "model.safetensors.index.json").is_file()
    r = _runner(path, wide)
    prompt = r.tokenizer.chat_prompt(MESSAGES)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    if r.cpu.wide_weights:  # a CPU without bf16 arithmetic serves the bf16-valued matrices (engine/cpu/wide.py)
        with torch.no_grad():
            for m in hf.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.copy_(m.weight.to(torch.bfloat16))
    assert hf.config.tie_word_embeddings == (kind == "tied") == r.model_config.tie_word_embeddings
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                          top_p=None, top_k=None, temperature=None)[0, len(prompt):].tolist()
        ref_logits = hf(ids).logits[0]
        ours_logits = r.cut_logits(ids[0], 0, 0)
    assert r.generate(prompt, 32, lane=1, stop_at_eos=True) == ref
    assert len(set(ref)) > 3  # a reply that says something, so the comparison can fail
    torch.testing.assert_close(ours_logits, ref_logits, rtol=1e-4, atol=1e-5)


def test_transformers_4_layout_reads_the_same(dirs, tmp_path):
    """4.x: top-level rope_theta, rope_scaling null, torch_dtype, eos as an int."""
    d5 = json.loads((dirs["plain"] / "config.json").read_text())
    d4 = {k: v for k, v in d5.items() if k not in ("rope_parameters", "dtype", "layer_types")}
    d4.update(rope_theta=d5["rope_parameters"]["rope_theta"], rope_scaling=None, torch_dtype="bfloat16")
    a, b = from_hf_dict(d5), from_hf_dict(d4)
    assert a == b and a.rope_theta == 50_000.0 and (a.dtype, b.dtype) == ("float32", "bfloat16")
    assert from_hf_dict({k: v for k, v in d4.items() if k != "rope_theta"}).rope_theta == 10_000.0


def test_eos_ids_and_generation_defaults(dirs):
    cfg, _, _ = resolve_model(str(dirs["plain"]))
    assert cfg.eos_token_ids == (2, 0) and cfg.eos_token_id == 2  # generation_config.json's list wins
    g = cfg.generation
    assert (g.temperature, g.top_p, g.top_k, g.do_sample) == (0.6, 0.95, 20, True)
    assert g.sampling_defaults() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    d = json.loads((dirs["plain"] / "config.json").read_text())
    d["eos_token_id"] = [7, 9, 7]
    assert from_hf_dict(d).eos_token_ids == (7, 9)  # config.json's when there is no generation file
    assert PRESETS["cpu"].eos_token_ids == (256,)


def test_every_eos_id_stops_the_engine(dirs):
    """The lane host (what the server runs) and runner.generate stop at any id of eos_token_ids."""
    import queue

    from engine.scheduler.host import LaneHost
    from engine.scheduler.sequence import Sequence
    cfg = EngineConfig(model=str(dirs["plain"]), load_format="safetensors", parallel=2, max_model_len=256,
                       prefill_rows=16)
    r = build_runner(cfg)
    prompt = r.tokenizer.chat_prompt(MESSAGES)
    free = r.generate(prompt, 8)
    r.eos_token_ids = (r.eos_token_ids[0], free[3])  # a second EOS id, as generation_config.json lists them
    want = free[:free.index(free[3]) + 1]
    assert r.generate(prompt, 8, stop_at_eos=True) == want
    host, events = LaneHost(r, cfg), queue.Queue()
    host.start()
    try:
        seq = Sequence(prompt=prompt, max_tokens=8, emit=lambda kind, payload: events.put((kind, payload)))
        host.submit(seq)
        while (ev := events.get(timeout=60))[0] == "token":
            pass
    finally:
        host.stop()
    assert ev == ("done", "stop") and seq.output == want


def _edit(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    d = json.loads((dst / "config.json").read_text())
    d.update(changes)
    (dst / "config.json").write_text(json.dumps({k: v for k, v in d.items() if v != "<drop>"}))
    return dst


def _serve_error(args, capsys, monkeypatch) -> str:
    """`tfengine serve ARGS` in this interpreter: exit 2 and the one line it printed."""
    from engine.cli import main
    monkeypatch.setattr(sys, "argv", ["tfengine", "serve", *args, "--port", "1"])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("changes,message", [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
     "RoPE type 'yarn' is not implemented"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}, "RoPE type 'linear'"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "model_type 'llama' is not implemented"),
    ({"architectures": ["Qwen3MoeForCausalLM"]}, "architectures ['Qwen3MoeForCausalLM'] are not implemented"),
    ({"model_type": "<drop>"}, "model_type None is not implemented"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window layers"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantized checkpoints"),
])
def test_refusals_are_one_line_through_serve(dirs, tmp_path, capsys, monkeypatch, changes, message):
    d = _edit(dirs["plain"], tmp_path / "m", **changes)
    err = _serve_error(["--model", str(d), "--load-format", "safetensors"], capsys, monkeypatch)
    assert message in err and f"--model {d}" in err


def test_index_naming_a_file_outside_is_refused(dirs, tmp_path):
    d = _edit(dirs["sharded"], tmp_path / "m")
    outside = tmp_path / "outside.safetensors"
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    shutil.move(d / index["weight_map"][first], outside)
    (d / index["weight_map"][first]).symlink_to(outside)  # a Hugging Face cache snapshot's layout: loads
    assert _runner(d).generate([1, 2, 3], 4) == _runner(dirs["sharded"]).generate([1, 2, 3], 4)
    for name in ("../outside.safetensors", str(outside)):
        index["weight_map"][first] = name
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(ConfigError, match="names a file outside the directory"):
            _runner(d)
    # and through the real command line, as a user meets it: exit 2, one line
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", str(d), "--load-format",
                        "safetensors", "--port", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "names a file outside the directory" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("changes,gen,message", [
    ({"hidden_size": None}, None, "lacks integer hidden_size"),
    ({"eos_token_id": [True]}, None, "eos_token_id must be"),
    ({"eos_token_id": None}, None, "names an eos_token_id"),
    ({"rope_parameters": {"rope_theta": -1.0}}, None, "rope_theta must be a positive number"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e4}}}, None, "per-layer-type"),
    ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}, None, "partial_rotary_factor"),
    ({"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 1, "layer_types": None}, None,
     "use_sliding_window"),
    ({"attention_bias": True}, None, "attention_bias"),
    ({"hidden_act": "gelu"}, None, "hidden_act 'gelu'"),
    ({"dtype": "float8_e4m3fn"}, None, "dtype 'float8_e4m3fn'"),
    ({}, {"temperature": "hot"}, "generation_config.json: temperature must be"),
])
def test_config_errors_name_the_field(dirs, changes, gen, message):
    d = json.loads((dirs["plain"] / "config.json").read_text())
    d.update(changes)
    with pytest.raises(ConfigError, match=message):
        from_hf_dict(d, gen)


def test_rope_scaling_default_is_plain_rope(dirs):
    d = json.loads((dirs["plain"] / "config.json").read_text())
    d.update(rope_scaling={"rope_type": "default"}, use_sliding_window=True, sliding_window=4096)  # 28 > 2 layers
    assert from_hf_dict(d).rope_theta == 50_000.0
