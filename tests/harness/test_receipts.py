"""Every committed receipt re-renders byte-identical from its data alone (what `tfbench report`
does), so a change to the renderers or the figures cannot silently rewrite a published receipt;
and the data's on-disk form (STEM.json.gz, older STEM.json still read) is small and lossless."""
import json
import random
from pathlib import Path

import pytest

from tensorfold_bench import report
from tensorfold_bench.errors import BenchError

DIR = Path(__file__).resolve().parents[2] / "receipts"
RECEIPTS = sorted(DIR.glob("*" + report.store.SUFFIX))


def test_there_are_receipts_and_all_in_the_compact_form():
    assert len(RECEIPTS) >= 8
    assert not list(DIR.glob("*.json")), "an indented receipt: rewrite it with report.store.write(report.read(path))"


@pytest.mark.parametrize("path", RECEIPTS, ids=[report.store.stem(p) for p in RECEIPTS])
def test_a_committed_receipt_re_renders_byte_identical(path):
    png, data = report.sibling(path, ".png"), report.read(path)
    md = report.render_markdown(data, png.name if png.exists() else None, report.more_pngs(data, png, draw=False))
    assert md == report.sibling(path, ".md").read_text()


def test_a_receipt_of_an_older_schema_loads_through_the_migration(tmp_path):
    """Version 1 (every receipt written before the schema was counted) reads as the current one:
    a long-prompt receipt with verdicts that lacks its statistics gets them from its runs, and
    renders as the committed Markdown; one without verdicts gets none; a newer version is refused."""
    src = DIR / "20261130-000006-long-prompt.json.gz"
    data = report.read(src)
    assert data["schema"] == report.store.SCHEMA == "tfbench.receipt/4" and data["stats"]
    old = {k: v for k, v in data.items() if k != "stats"} | {"schema": "tfbench.receipt/1"}
    back = report.read(report.store.write(old, tmp_path, "old-long-prompt"))
    assert back["schema"] == report.store.SCHEMA and json.loads(json.dumps(back["stats"])) == data["stats"]
    assert report.render_markdown(back, "20261130-000006-long-prompt.png") == report.sibling(src, ".md").read_text()
    url = old | {"settings": old["settings"] | {"url": "http://127.0.0.1:1"}}
    assert "stats" not in report.read(report.store.write(url, tmp_path, "url-long-prompt"))
    newer = report.store.write({"schema": "tfbench.receipt/99"}, tmp_path, "newer")
    with pytest.raises(BenchError, match="newer than this tfbench reads"):
        report.read(newer)


def test_report_rewrites_the_markdown_beside_the_data(tmp_path):
    src = next(p for p in RECEIPTS if "sweep" in p.name)
    data = tmp_path / src.name
    data.write_bytes(src.read_bytes())
    png, md = report.sibling(src, ".png").name, report.sibling(src, ".md").read_text()
    assert report.rerender(data) == md.replace(png, report.sibling(data, ".png").name)
    assert report.sibling(data, ".png").stat().st_size > 10_000 and report.sibling(data, ".md").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{report.store.stem(src)}.{x}" for x in ("json.gz", "md", "png")]


def test_compare_two_committed_sweeps():
    a, b = [p for p in RECEIPTS if "sweep" in p.name][:2]
    md = report.compare.markdown(report.read(a), report.read(b), a.name, b.name)
    rows = [ln for ln in md.splitlines() if ln.startswith("| tok_s@1 | whole |")]
    assert len(rows) == 1 and ("within A's span" in rows[0] or "outside A's span" in rows[0])


def per_token_receipt(n: int = 10_000) -> dict:
    """A long-prompt-like receipt with n tokens' times (seconds to the nanosecond), ids and gaps:
    the bulk of a real one."""
    rng = random.Random(1)
    t, times = 51.717645412, []
    for _ in range(n):
        t = round(t + 0.005 + rng.gauss(0, 0.0002), 9)
        times.append(t)
    gaps = [round((b - a) * 1e6) for a, b in zip(times, times[1:])]
    return {"schema": report.store.SCHEMA, "scenario": "long-prompt", "partial": None,
            "runs": [{"records": {"A": {"token_times": times, "token_ids": [rng.randrange(151_936) for _ in times]}},
                      "batches": [{"gaps_us": [gaps], "sent": [t]}]}],
            "edges": [0.1 + 0.2, 5e-324, 1.7976931348623157e308, -0.0, 2 ** 80, -1, "é ✓", None, True, {}]}


def test_the_writer_is_compact_and_reads_back_equal(tmp_path):
    data = per_token_receipt()
    path = report.store.write(data, tmp_path, "x-long-prompt")
    assert path.name == "x-long-prompt.json.gz" and not list(tmp_path.glob("*.tmp"))
    indented = len(json.dumps(data, indent=1))  # the old form: 462 kB
    assert path.stat().st_size < 120_000 < indented / 3
    back = report.read(path)
    assert back == data
    assert [repr(x) for x in back["edges"]] == [repr(x) for x in data["edges"]]  # -0.0 stays -0.0


def test_an_old_receipt_still_loads_and_renders_beside_itself(tmp_path):
    """An indented STEM.json from before: `tfbench report` (report.rerender) writes STEM.md beside
    it, as it did, and `tfbench compare` (report.read) reads it."""
    src = next(p for p in RECEIPTS if "long-prompt" in p.name)
    data = report.read(src)
    old = tmp_path / f"{report.store.stem(src)}.json"
    old.write_text(json.dumps(data, indent=1) + "\n")
    assert report.read(old) == data
    assert report.rerender(old, png=False) == report.render_markdown(data, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [old.name, report.sibling(old, ".md").name]
    assert report.sibling(old, ".md").read_text() == report.render_markdown(data, None)
    assert "## tfbench compare" in report.compare.markdown(report.read(old), data, old.name, src.name)


def test_a_partial_receipt_is_written_in_the_new_form_only(tmp_path):
    """As the lifecycle writes it after each run: the data and the Markdown, no picture."""
    data = report.read(min(RECEIPTS, key=lambda p: p.stat().st_size))
    data["partial"] = {"done": 1, "total": len(data["runs"]) + 1, "missing": ["run 9 (x)"]}
    paths = report.write(data, tmp_path, "s-partial", png=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s-partial.json.gz", "s-partial.md"]
    assert report.read(paths["json"]) == data
    assert "**Partial receipt (in progress).** 1 of" in paths["md"].read_text()


def test_the_receipts_data_is_written_last(tmp_path, monkeypatch):
    """A reader that waits for STEM.json.gz (a partial receipt after the first run) finds its
    Markdown and picture already there."""
    data = report.read(min(RECEIPTS, key=lambda p: p.stat().st_size))
    real, seen = report.store.write, []

    def spy(d, out_dir, name):
        seen.append(sorted(p.name for p in Path(out_dir).iterdir() if not p.name.startswith(".")))
        return real(d, out_dir, name)
    monkeypatch.setattr(report.store, "write", spy)
    paths = report.write(data, tmp_path, "s")
    assert seen == [sorted(p.name for p in paths.values() if p.name != "s.json.gz")]
    assert "s.md" in seen[0] and "s.png" in seen[0] and report.read(paths["json"]) == data


def test_token_times_are_stored_compactly_and_read_back_exactly(tmp_path):
    """A sweep batch's gaps go to disk across streams (each stream's arrivals minus the previous
    stream's at the same token), a record's token times as nanosecond deltas; both read back
    exactly, with ragged, empty and single streams, and a list that is not 9-decimal stays as it is."""
    gaps = [[52_000, 5_010, 4_990, 5_003], [52_040, 5_002, 4_999], [], [51_990, 5_020, 4_980, 5_001, 5_000],
            [7]]
    sent = [10.000001, 10.000052, 10.000104, 10.000153, 10.0002]
    odd = [1.0000000001, 2.0]  # ten decimals: n / 1e9 would not give it back
    data = {"schema": report.store.SCHEMA, "runs": [{"batches": [{"sent": sent, "gaps_us": gaps, "x": 1},
                                                                 {"gaps_us": [[3, 4], [5]]}],
                                                     "records": {"A": {"token_times": [1.25, 1.250000001, 3.5]},
                                                                 "B": {"token_times": odd}}}]}
    disk = json.loads(__import__("gzip").decompress(report.store.encode(data)))
    b0 = disk["runs"][0]["batches"][0]
    assert list(b0) == ["sent", "gaps_us_across", "x"]  # renamed in place
    # stream 1 sent 51 us after stream 0: its arrivals 52,091 57,093 62,092 less 52,000 57,010 62,000
    assert b0["gaps_us_across"][1] == [91, 83, 92] and b0["gaps_us_across"][:1] == gaps[:1]
    assert disk["runs"][0]["records"]["A"] == {"token_times_ns": [1_250_000_000, 1, 2_249_999_999]}
    assert disk["runs"][0]["records"]["B"] == {"token_times": odd}
    back = report.store.decode(report.store.encode(data))
    assert back == data and json.dumps(back) == json.dumps(data)


def test_the_committed_sweeps_are_stored_across_streams():
    """The migration ran: no committed receipt keeps plain gaps on disk, and the H200's 64-stream
    sweep is under 0.85 MB (1.0 MB as plain gaps; a sweep to 256 streams holds four times the tokens)."""
    import gzip
    sweeps = [p for p in RECEIPTS if "sweep" in p.name]
    for p in sweeps:
        raw = gzip.decompress(p.read_bytes())
        assert b'"gaps_us":' not in raw, p.name
    assert (DIR / "20261201-230639-sweep.json.gz").stat().st_size < 850_000
    assert report.store.read(DIR / "20261201-230639-sweep.json.gz")["runs"][0]["batches"][0]["gaps_us"]
