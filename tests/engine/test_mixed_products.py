"""tools/mixed_products.py (the H200 probe of a mixed forward's products) runs end to end under
Triton's interpreter on a tiny shape: its bits table comes out whole (on the CPU it times nothing)."""
import pytest

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed")


@pytest.mark.interpreted
def test_the_probe_runs_and_reports_every_product(tmp_path, capsys):
    from tools.mixed_products import main
    out = tmp_path / "p.md"
    main(["--model", "tiny", "--rows", "16,40", "--grid", "64", "--out", str(out)])
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.split("|")[1].strip() in ("qkv", "o", "gate_up", "down")]
    assert len(rows) == 8
    assert all(ln.rstrip().endswith("True |") for ln in rows)  # the tiles: a row's bits at any row count
