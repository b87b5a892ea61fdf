import hashlib

import pytest

from tensorfold_bench.analysis import predictions as pr

YAML = """\
stepped p=0.5:
  a_rate_during_b_pct: [40, 60]
  c_first_token_s: [0, 0.5]
  b_first_token_s vs whole: [1.7, 2.4]
  tok_s@8 pct whole: [-2, 2]
whole:
  c_first_token_s: {min: 2}
  b_first_token_s_vs_b_alone_s: [0.9, 1.1]
"""

MEDIANS = {
    "whole": {"c_first_token_s": 5.0, "b_first_token_s": 4.0, "b_alone_s": 4.1, "tok_s@8": 100.0},
    "stepped p=0.5": {"a_rate_during_b_pct": 49.0, "c_first_token_s": 0.7, "b_first_token_s": 8.2,
                      "tok_s@8": 99.0},
}


def test_read_hash_stamp_and_check(tmp_path):
    f = tmp_path / "pred.yaml"
    f.write_text(YAML)
    p = pr.read(f, ["whole", "stepped p=0.5"])
    assert p.sha256 == hashlib.sha256(YAML.encode()).hexdigest()
    assert p.read_at.endswith("+00:00") and len(p.items) == 6
    p.check(MEDIANS)
    got = {(i.variant, i.key): (i.status, i.value) for i in p.items}
    assert got[("stepped p=0.5", "a_rate_during_b_pct")] == ("in", 49.0)
    assert got[("stepped p=0.5", "c_first_token_s")] == ("out", 0.7)
    assert got[("stepped p=0.5", "b_first_token_s vs whole")][0] == "in"  # 2.05
    assert got[("stepped p=0.5", "tok_s@8 pct whole")] == ("in", pytest.approx(-1.0))
    assert got[("whole", "c_first_token_s")] == ("in", 5.0)
    assert got[("whole", "b_first_token_s_vs_b_alone_s")][0] == "in"
    assert (p.hits, p.checked) == (5, 6)
    assert "5 of 6 predictions in range" in "\n".join(p.markdown())
    assert pr.Predictions.from_dict(p.to_dict()) == p


def test_unmeasured_is_not_counted():
    p = pr.Predictions("x", "0", "t", pr.parse("new:\n  nothing: [1, 2]\n"))
    p.check({"new": {}})
    assert p.items[0].status == pr.UNMEASURED and p.checked == 0
    assert "not measured" in p.summary()


@pytest.mark.parametrize("text,needle", [
    ("new: [1, 2]\n", "new: expected a mapping"),
    ("new:\n  tok_s: [2, 1]\n", "new: tok_s: lo 2 > hi 1"),
    ("new:\n  tok_s: [1]\n", "new: tok_s: expected [lo, hi]"),
    ("new:\n  tok_s: [a, 1]\n", "new: tok_s: 'a' is not a number"),
    ("new:\n  tok_s: [null, null]\n", "both ends open"),
    ("- 1\n", "expected a mapping of variant name"),
    ("new: {tok_s: [1, 2\n", "not valid YAML"),
])
def test_errors_name_file_and_key(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(pr.PredictionError) as e:
        pr.read(f)
    assert str(f) in str(e.value) and needle in str(e.value)


def test_unknown_variant_and_missing_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("newer:\n  tok_s: [1, 2]\n")
    with pytest.raises(pr.PredictionError, match="newer: no such variant"):
        pr.read(f, ["base", "new"])
    with pytest.raises(pr.PredictionError, match="cannot read"):
        pr.read(tmp_path / "missing.yaml")


def test_receipt_names_no_folder_outside_the_working_directory(tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere" / "pred.yaml"
    outside.parent.mkdir()
    outside.write_text(YAML)
    inside = tmp_path / "repo" / "receipts" / "pred.yaml"
    inside.parent.mkdir(parents=True)
    inside.write_text(YAML)
    monkeypatch.chdir(tmp_path / "repo")
    assert pr.read(outside).path == "pred.yaml"
    assert pr.read(inside.resolve()).path == "receipts/pred.yaml"
    assert pr.read("receipts/pred.yaml").path == "receipts/pred.yaml"
