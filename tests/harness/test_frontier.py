"""The long-prompt receipt's frontier: each variant's B slowdown against A's kept rate, its distance
from the time-slicing line 1 - 1/slowdown, which variants dominate it, and its picture."""
from pathlib import Path

import pytest

from tensorfold_bench import report
from tensorfold_bench.analysis import figures
from tensorfold_bench.analysis.figures import LongPromptFigures, frontier
from tensorfold_bench.report import long_prompt, pictures

SMALL = Path(__file__).resolve().parents[2] / "receipts" / "20261129-232014-long-prompt.json.gz"  # 3 variants


def figs(b_first: float | None, during: float | None, before: float | None = 100.0, valid: bool = True) -> dict:
    return LongPromptFigures(b_first, 0.05, 0.1, during, before, 0, b_first, {}, valid=valid).to_dict()


def receipt(trades: dict[str, tuple], alone: float | None = 1.0) -> dict:
    """Receipt-shaped data, one run per variant: name -> (B slowdown, A kept %[, args]); B alone
    takes `alone` s and A runs at 100 tok/s before B, so the figures read back as given."""
    variants = [{"name": n, "args": list(t[2]) if len(t) > 2 else []} for n, t in trades.items()]
    runs = [{"index": i + 1, "variant": n, "figures": figs(None if t[0] is None else t[0] * (alone or 1.0), t[1])}
            for i, (n, t) in enumerate(trades.items())]
    return {"scenario": "long-prompt", "variants": variants, "runs": runs,
            "alone": {n: {"b_first_token": alone} for n in trades}}


def by_name(rows: list[dict]) -> dict[str, dict]:
    return {r["variant"]: r for r in rows}


def test_rows_are_ordered_by_b_slowdown():
    data = receipt({"whole": (1.0, 2.0), "stepped p=0.5": (2.0, 48.0), "mixed budget=80": (1.6, 23.0),
                    "stepped p=1": (1.1, 10.0)})
    assert [r["variant"] for r in frontier(data)] == ["whole", "stepped p=1", "mixed budget=80", "stepped p=0.5"]
    assert [r["slowdown"] for r in frontier(data)] == pytest.approx([1.0, 1.1, 1.6, 2.0])


def test_vs_the_line_is_a_kept_minus_one_minus_one_over_slowdown_in_points():
    rows = by_name(frontier(receipt({"stepped p=0.5": (2.0, 48.0), "mixed budget=80": (1.6, 23.0),
                                     "whole": (1.0, 2.0)})))
    assert rows["stepped p=0.5"]["kept"] == pytest.approx(48.0)
    assert rows["stepped p=0.5"]["vs_line"] == pytest.approx(-2.0)
    assert rows["mixed budget=80"]["vs_line"] == pytest.approx(-14.5)
    assert rows["whole"]["vs_line"] == pytest.approx(2.0)  # the line is 0 at 1x: all A kept is above it


def test_dominance_needs_both_no_worse_and_one_strictly_better():
    rows = by_name(frontier(receipt({
        "a": (1.5, 30.0),
        "slower and keeps less": (2.0, 25.0),  # a is better on both
        "slower, keeps as much": (2.0, 30.0),  # a and the next are no worse on either and better on one
        "as slow, keeps less": (1.5, 20.0),
        "twin of a": (1.5, 30.0),  # equal on both: neither dominates the other
        "faster, keeps less": (1.2, 10.0),  # a trade, not dominated
    })))
    assert rows["a"]["dominated_by"] == [] and rows["twin of a"]["dominated_by"] == []
    assert rows["faster, keeps less"]["dominated_by"] == []
    assert set(rows["slower and keeps less"]["dominated_by"]) == {"a", "slower, keeps as much", "twin of a"}
    assert set(rows["slower, keeps as much"]["dominated_by"]) == {"a", "twin of a"}
    assert set(rows["as slow, keeps less"]["dominated_by"]) == {"a", "twin of a"}


def test_variants_missing_a_median_are_left_out_and_fewer_than_two_leave_no_frontier():
    data = receipt({"whole": (1.0, 2.0), "stepped p=0.5": (2.0, 48.0), "no b": (None, 40.0)})
    data["runs"].append({"index": 4, "variant": "all invalid", "figures": figs(1.5, 30.0, valid=False)})
    data["variants"].append({"name": "all invalid", "args": []})
    assert [r["variant"] for r in frontier(data)] == ["whole", "stepped p=0.5"]
    assert frontier(receipt({"whole": (1.0, 2.0), "no b": (None, 40.0)})) == []
    assert frontier(receipt({"whole": (1.0, 2.0), "stepped p=0.5": (2.0, 48.0)}, alone=None)) == []  # no B alone
    one = receipt({"whole": (1.0, 2.0)})
    assert frontier(one) == [] and long_prompt.frontier_lines(one) == []
    assert pictures.frontier(one, Path("/nonexistent/never-written.png")) is None


def test_the_prefill_mode_comes_from_the_variants_args():
    rows = by_name(frontier(receipt({"s": (2.0, 48.0, ["--prefill-mode", "stepped", "--prefill-share", "0.5"]),
                                     "m": (1.3, 10.0, ["--prefill-mode=mixed"]), "vllm": (1.2, 3.0)})))
    assert (rows["s"]["mode"], rows["m"]["mode"], rows["vllm"]["mode"]) == ("stepped", "mixed", None)


def test_the_section_renders_rows_in_order_with_the_line_and_dominance():
    lines = long_prompt.frontier_lines(receipt({"stepped p=0.5": (2.0, 48.0), "mixed budget=80": (1.6, 23.0),
                                                "worse": (2.5, 20.0)}))
    assert lines[0].startswith("**Frontier.**")
    table = [ln for ln in lines if ln.startswith("| ")]
    assert table[0] == "| variant | B slowdown (x alone) | A kept (%) | vs the line (points) | dominated by |"
    assert table[1:] == ["| mixed budget=80 | 1.60x | 23.0 | -14.5 | — |",
                         "| stepped p=0.5 | 2.00x | 48.0 | -2.0 | — |",
                         "| worse | 2.50x | 20.0 | -40.0 | stepped p=0.5, mixed budget=80 |"]
    assert not any("frontier.png" in ln for ln in lines)  # no picture given, none linked
    assert not any(ln.startswith("Under 1x") for ln in lines)
    noisy = long_prompt.frontier_lines(receipt({"whole": (0.8, 1.0), "stepped p=0.5": (2.0, 48.0)}))
    assert "| whole | 0.80x | 1.0 | +26.0 | — |" in noisy and any(ln.startswith("Under 1x") for ln in noisy)


def test_a_committed_receipt_has_the_section_after_the_variant_table():
    data = report.read(SMALL)
    md = report.render_markdown(data)
    assert "**Frontier.**" in md and "| variant | B slowdown (x alone) |" in md
    assert md.index("| variant | B first token |") < md.index("**Frontier.**") < md.index("Every run (late:")
    assert "-frontier.png" not in md
    linked = report.render_markdown(data, None, {"frontier": "X-frontier.png"})
    assert "](X-frontier.png)" in linked and linked.index("](X-frontier.png)") < linked.index("Every run (late:")


def test_the_picture_is_written_beside_the_timeline_and_linked_only_when_written(tmp_path):
    data = report.read(SMALL)
    paths = report.write(data, tmp_path / "png", "s")
    assert paths["png-frontier"] == tmp_path / "png" / "s-frontier.png" and paths["png-frontier"].stat().st_size > 5000
    assert "](s-frontier.png)" in paths["md"].read_text() and "](s.png)" in paths["md"].read_text()
    paths = report.write(data, tmp_path / "nopng", "s", png=False)  # --no-png: neither picture
    assert sorted(p.name for p in (tmp_path / "nopng").iterdir()) == ["s.json.gz", "s.md"]
    assert "frontier.png" not in paths["md"].read_text()
    # `tfbench report --no-png` draws nothing but links a picture already beside the receipt
    (tmp_path / "nopng" / "s-frontier.png").write_bytes((tmp_path / "png" / "s-frontier.png").read_bytes())
    assert "](s-frontier.png)" in report.rerender(paths["json"], png=False)


def test_the_picture_draws_share_and_mixed_variants(tmp_path):
    data = receipt({"whole": (1.0, 2.0, ["--prefill-mode", "whole"]),
                    "stepped p=1": (1.1, 10.0, ["--prefill-mode", "stepped"]),
                    "stepped p=0.5": (2.0, 48.0, ["--prefill-mode", "stepped"]),
                    "mixed budget=80": (1.3, 10.0, ["--prefill-mode", "mixed"]),
                    "mixed budget=20": (19.0, 8.0, ["--prefill-mode", "mixed"])})
    out = pictures.frontier(data, tmp_path / "f.png")
    assert out == tmp_path / "f.png" and out.stat().st_size > 5000


def test_the_targets_name_the_variants_that_meet_them_and_the_picture_marks_them(tmp_path):
    data = receipt({"whole": (1.0, 2.0), "split sms=32": (1.2, 50.0), "stepped p=0.5": (2.0, 48.0),
                    "split sms=40": (1.6, 76.0)})
    met = {(x, kept): names for x, kept, names in figures.targets_met(frontier(data))}
    assert met == {(1.25, 45.0): ["split sms=32"], (1.7, 75.0): ["split sms=40"]}
    assert [names for *_, names in figures.targets_met(frontier(data), ((1.1, 60.0),))] == [[]]
    assert pictures.frontier(data, tmp_path / "f.png").stat().st_size > 0
