"""Every committed receipt re-renders byte-identical from its JSON alone (what `tfbench report`
does), so a change to the renderers or the figures cannot silently rewrite a published receipt."""
from pathlib import Path

import pytest

from tensorfold_bench import report

RECEIPTS = sorted((Path(__file__).resolve().parents[1] / "receipts").glob("*.json"))


def test_there_are_receipts():
    assert len(RECEIPTS) >= 8


@pytest.mark.parametrize("path", RECEIPTS, ids=[p.stem for p in RECEIPTS])
def test_a_committed_receipt_re_renders_byte_identical(path):
    png = path.with_suffix(".png")
    md = report.render_markdown(report.load(path), png.name if png.exists() else None)
    assert md == path.with_suffix(".md").read_text()


def test_report_rewrites_the_markdown_beside_the_json(tmp_path):
    src = next(p for p in RECEIPTS if "sweep" in p.name)
    js = tmp_path / src.name
    js.write_bytes(src.read_bytes())
    assert report.rerender(js) == src.with_suffix(".md").read_text().replace(src.with_suffix(".png").name, js.with_suffix(".png").name)
    assert js.with_suffix(".png").stat().st_size > 10_000 and js.with_suffix(".md").exists()


def test_compare_two_committed_sweeps():
    a, b = [p for p in RECEIPTS if "sweep" in p.name][:2]
    md = report.compare.markdown(report.load(a), report.load(b), a.name, b.name)
    rows = [ln for ln in md.splitlines() if ln.startswith("| tok_s@1 | whole |")]
    assert len(rows) == 1 and ("within A's span" in rows[0] or "outside A's span" in rows[0])
