"""tools/serve_compare.py's table (the engine bench's side-by-side column) and its skip note."""
import json
from pathlib import Path

from rich.console import Console

from tools import serve_compare as sc
from tools.bench import served_comparison


def fig(agg1, agg8, long_s):
    sweep = {k: {"agg_tok_s": agg1 * k if k < 8 else agg8, "stream_tok_s": agg1, "first_token_s": 0.1}
             for k in sc.STREAMS}
    return {"sweep": sweep, "long_first_token_s": long_s, "runs": 3}


def test_rows_put_tfengine_beside_vllm_with_the_ratio():
    rows = sc.table_rows({"tfengine": fig(50, 300, 2.0), "vLLM": fig(100, 600, 1.0)})
    assert rows[0] == ["aggregate tok/s, 1 stream", "50", "100", "0.50x"]
    assert rows[3] == ["aggregate tok/s, 8 streams", "300", "600", "0.50x"]
    assert rows[-1][1:] == ["2.00", "1.00", "2.00x"]


def test_one_engine_has_no_ratio_and_json_keys_read_back():
    med = json.loads(json.dumps({"tfengine": fig(50, 300, 2.0)}))  # sweep keys become strings
    rows = sc.table_rows(med)
    assert rows[0] == ["aggregate tok/s, 1 stream", "50"]
    out = {"engines": med, "vllm_skipped": "no --vllm python given", "loadavg": (1.0, 1.0, 1.0), "command": "x"}
    md = sc.markdown(out)
    assert "| aggregate tok/s, 8 streams | 300 |" in md and "vLLM skipped: no --vllm python given" in md


def test_bench_says_why_the_vllm_column_is_skipped(tmp_path):
    console = Console(record=True, width=200)
    assert served_comparison(None, tmp_path / "m", 1, console) is None
    assert served_comparison(Path(tmp_path / "no" / "python"), tmp_path / "m", 1, console) is None
    text = console.export_text()
    assert "skipped: vLLM for CPU not installed" in text and "does not exist" in text
    assert not (tmp_path / "m").exists()  # nothing written, nothing started


def test_bench_finds_an_installed_vllm(monkeypatch, tmp_path):
    """The side-by-side column runs whenever vLLM for CPU is installed, no flag needed."""
    import tools.bench as b
    monkeypatch.setattr(b, "DEFAULT_VLLM", tmp_path / "venv" / "bin" / "python")
    given = tmp_path / "other"
    assert b.find_vllm(given) == given
    found = b.find_vllm(None)
    import importlib.util
    assert found == (Path(b.sys.executable) if importlib.util.find_spec("vllm") else None)
    b.DEFAULT_VLLM.parent.mkdir(parents=True)
    b.DEFAULT_VLLM.touch()
    assert b.find_vllm(None) == b.DEFAULT_VLLM


def test_a_baseline_tfengine_gets_its_own_column_and_ratio(tmp_path):
    """`--baseline TREE`: main's tfengine beside this tree's and vLLM, each over vLLM."""
    base = sc.tfengine_server(tmp_path / "m", tmp_path, tmp_path / "main")
    assert base.name == "tfengine main" and base.env["PYTHONPATH"] == str((tmp_path / "main").absolute())
    med = {"tfengine": fig(60, 330, 2.0), base.name: fig(50, 300, 2.0), "vLLM": fig(100, 600, 1.0)}
    rows = sc.table_rows(med)
    assert rows[0] == ["aggregate tok/s, 1 stream", "60", "50", "100", "0.60x", "0.50x"]
    out = {"engines": med, "vllm_skipped": None, "loadavg": (1.0, 1.0, 1.0), "command": "x"}
    assert "| what | tfengine | tfengine main | vLLM | tfengine / vLLM | tfengine main / vLLM |" in sc.markdown(out)
