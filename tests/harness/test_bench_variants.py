"""Variants from shares, files and refs, and the order runs go in."""
import textwrap

import pytest

from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.session import variants
from tensorfold_bench.session.variants import WHOLE, Variant, default_order, parse_floats, parse_order, plain, share_variants


def test_share_variants_and_default_order():
    base, news = share_variants(parse_floats("--share", "1,0.75,0.5"))
    assert base == WHOLE and [v.name for v in news] == ["stepped p=1", "stepped p=0.75", "stepped p=0.5"]
    assert news[2].args == ["--prefill-mode", "stepped", "--prefill-share", "0.5"]
    assert default_order(base, news[2:]) == ["whole", "stepped p=0.5", "stepped p=0.5", "whole"]
    assert default_order(base, news[:2]) == ["whole", "stepped p=1", "stepped p=0.75", "stepped p=0.75", "stepped p=1", "whole"]


def test_order_names_and_aliases():
    base, news = share_variants([0.5])
    assert parse_order("base,new,new,base,new", [base, *news]) == ["whole", "stepped p=0.5", "stepped p=0.5", "whole", "stepped p=0.5"]
    with pytest.raises(FlagError, match="--order"):
        parse_order("base,other", [base, *news])


def test_plain_reference_flags_win():
    p = plain(Variant("x", ["--prefill-mode", "stepped", "--parallel", "8"], {"A": "1"}))
    assert p.args[-6:] == ["--prefill-mode", "whole", "--no-prompt-cache", "--no-drafts", "--parallel", "1"]
    assert p.env == {"A": "1"}


def test_round_trip():
    v = Variant("n", ["--a"], {"K": "v"}, ref="HEAD~1")
    assert Variant.from_dict(v.to_dict()) == v


def test_variants_file(tmp_path):
    f = tmp_path / "v.yaml"
    f.write_text(textwrap.dedent("""\
        - name: main
          ref: main
          flags: [--prefill-mode, whole]
        - name: new
          flags: --prefill-mode stepped --prefill-share 0.5
          env: {TFENGINE_DECODE_SLEEP_MS: 5}
    """))
    main, new = variants.read_variants(f)
    assert (main.name, main.ref, main.args, main.env) == ("main", "main", ["--prefill-mode", "whole"], {})
    assert new.args == ["--prefill-mode", "stepped", "--prefill-share", "0.5"]
    assert new.env == {"TFENGINE_DECODE_SLEEP_MS": "5"} and new.ref is None
    by_name = variants.parse_variants("old: {ref: HEAD~1}\nnew: {}\n")
    assert [(v.name, v.ref) for v in by_name] == [("old", "HEAD~1"), ("new", None)]


@pytest.mark.parametrize("text,needle", [
    ("- name: a\n  colour: red\n", "a: unknown key(s) colour"),
    ("- name: a\n- name: a\n", "a: defined twice"),
    ("- {flags: x}\n", "entry 1: expected a mapping with a name"),
    ("- name: a\n  env: [1]\n", "a: env must be a mapping"),
    ("- name: a\n  flags: {x: 1}\n", "a: flags must be"),
    ("3\n", "expected a list of variants"),
])
def test_variants_file_errors(text, needle):
    with pytest.raises(BenchError) as e:
        variants.parse_variants(text, "v.yaml")
    assert "v.yaml" in str(e.value) and needle in str(e.value)


def test_mixed_budgets_add_mixed_variants_after_the_shares():
    vs = variants.select_variants("1,0.5", budgets="40,80")
    assert [v.name for v in vs] == ["whole", "stepped p=1", "stepped p=0.5", "mixed budget=40", "mixed budget=80"]
    assert vs[3].args == ["--prefill-mode", "mixed", "--mixed-budget", "40"]
    alone = variants.select_variants(None, budgets="25.5")  # without --share: whole and the budgets only
    assert [v.name for v in alone] == ["whole", "mixed budget=25.5"]
    assert [v.name for v in variants.select_variants(None)] == ["whole", "stepped p=0.5"]  # the default kept


@pytest.mark.parametrize("flag,kw,text,needle", [
    *[("--mixed", "budgets", t, n) for t, n in [("", "empty"), ("40,x", "not a number"), ("0", "positive"),
                                                 ("-5", "positive"), ("inf", "positive"), ("40,40", "repeats")]],
    *[("--split", "sms", t, n) for t, n in [("", "empty"), ("16,x", "not a number"), ("12", "multiple of 8"),
                                             ("0", "multiple of 8"), ("8.5", "multiple of 8"), ("16,16", "repeats")]],
])
def test_bad_mixed_budgets_and_split_counts_name_the_flag(flag, kw, text, needle):
    with pytest.raises(FlagError, match=needle) as e:
        variants.select_variants(None, **{kw: text})
    assert e.value.flag == flag


@pytest.mark.parametrize("flag,kw,value", [("--mixed", "budgets", "40"), ("--split", "sms", "32")])
def test_mixed_or_split_with_a_variants_file_or_a_url_is_refused(tmp_path, flag, kw, value):
    from tensorfold_bench.session import targets
    f = tmp_path / "v.yaml"
    f.write_text("- name: a\n- name: b\n")
    with pytest.raises(FlagError, match="not both"):
        variants.select_variants(None, str(f), **{kw: value})
    with pytest.raises(FlagError, match=f"{flag} needs servers tfbench launches"):
        targets.select("http://127.0.0.1:9", None, None, None, None, None, False, **{kw: value})


def test_split_counts_add_split_variants_after_the_budgets():
    vs = variants.select_variants("0.5", budgets="40", sms="16,32")
    assert [v.name for v in vs] == ["whole", "stepped p=0.5", "mixed budget=40", "split sms=16", "split sms=32"]
    assert vs[3].args == ["--prefill-mode", "split", "--decode-sms", "16"]
    assert [v.name for v in variants.select_variants(None, sms="48")] == ["whole", "split sms=48"]


def test_flag_value_reads_both_spellings_and_the_last_wins():
    from tensorfold_bench.servers.launcher import flag_value
    args = ["--prefill-mode", "stepped", "--prefill-share=0.5", "--prefill-mode=mixed", "--trace"]
    assert flag_value(args, "--prefill-mode") == "mixed" and flag_value(args, "--prefill-share") == "0.5"
    assert flag_value(args, "--mixed-budget") is None and flag_value(["--prefill-mode"], "--prefill-mode") is None
