from tensorfold_bench.variants import WHOLE, Variant, default_order, parse_floats, parse_order, plain, share_variants

import pytest

from tensorfold_bench.errors import FlagError


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
