"""A variant that runs other kernels than the base (and so the plain reference) is named in the
receipt: a reply that differs there may be the kernels' bits, not the schedule's."""
from pathlib import Path

from tensorfold_bench.analysis.exactness import arithmetic_flags, other_kernels, other_kernels_line
from tensorfold_bench.receipt import Receipt, Variant
from tensorfold_bench.report import store
from tensorfold_bench.report.long_prompt import exactness_lines

RECEIPTS = Path(__file__).resolve().parents[2] / "receipts"


def test_arithmetic_flags_are_read_with_their_values_in_either_spelling():
    assert arithmetic_flags(["--prefill-mode", "mixed", "--cut-attention", "tiles", "--dtype=float32", "--trace"]) == \
        ["--cut-attention tiles", "--dtype float32"]
    assert arithmetic_flags(["--prefill-mode", "split", "--decode-sms", "32", "--parallel", "8"]) == []


def test_only_flags_beyond_the_bases_are_named_and_foreign_servers_are_left_out():
    variants = [Variant(name="whole", args=["--prefill-mode", "whole", "--dtype", "bfloat16"]),
                Variant(name="stepped p=0.5", args=["--prefill-mode", "stepped", "--prefill-share", "0.5",
                                                    "--dtype", "bfloat16"]),
                Variant(name="mixed", args=["--prefill-mode", "mixed", "--cut-attention", "tiles", "--dtype", "bfloat16"]),
                Variant(name="vllm", args=["--cut-attention", "tiles"], url="http://127.0.0.1:8000")]
    assert other_kernels(variants, "whole") == {"mixed": ["--cut-attention tiles"]}
    assert other_kernels(variants[:2], "whole") == {} and other_kernels_line(variants[:2], "whole") is None
    line = other_kernels_line(variants, "whole")
    assert "mixed runs `--cut-attention tiles`" in line and "plain reference" in line and "--engine-arg" in line


def test_the_h100_mixed_receipt_says_why_its_a_may_differ_and_the_frontier_says_nothing():
    mixed = Receipt.from_dict(store.read(RECEIPTS / "20261207-083348-long-prompt.json.gz"))
    assert any(line.startswith("- Other arithmetic: mixed budget=40 runs `--cut-attention tiles`")
               for line in exactness_lines(mixed))
    frontier = Receipt.from_dict(store.read(RECEIPTS / "20261207-082235-long-prompt.json.gz"))
    assert not any("Other arithmetic" in line for line in exactness_lines(frontier))
