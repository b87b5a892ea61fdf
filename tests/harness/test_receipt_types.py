"""The typed receipt (tensorfold_bench.receipt) reads every committed receipt and gives back exactly
the data it read: the same keys, in the same order, with the same values."""
import json
from pathlib import Path

import pytest

from tensorfold_bench import receipt
from tensorfold_bench.report import store
from tensorfold_bench.workload.script_file import Script

DIR = Path(__file__).resolve().parents[2] / "receipts"


def is_receipt(path: Path) -> bool:
    """A file under receipts/ that holds a receipt (beside it lie profiles and kernel checks)."""
    try:
        data = store.decode(path.read_bytes())
    except ValueError:
        return False
    return isinstance(data, dict) and str(data.get("schema", "")).startswith("tfbench.receipt/")


PATHS = sorted(p for suffix in (store.SUFFIX, store.OLD_SUFFIX) for p in DIR.rglob("*" + suffix)
               if not (suffix == store.OLD_SUFFIX and p.name.endswith(store.SUFFIX)) and is_receipt(p))


def test_every_committed_receipt_is_found():
    assert len(PATHS) >= len(list(DIR.glob("*" + store.SUFFIX))) >= 8


@pytest.mark.parametrize("path", PATHS, ids=[str(p.relative_to(DIR)) for p in PATHS])
def test_a_committed_receipt_round_trips_through_the_typed_receipt(path):
    data = store.read(path)
    typed = receipt.Receipt.from_dict(data)
    back = typed.to_dict()
    assert back == data
    assert json.dumps(back) == json.dumps(data)  # the keys' order too: a rewrite gives the same bytes
    assert isinstance(typed.settings, receipt.Settings) and isinstance(typed.host, receipt.Host)
    for run in typed.runs:
        assert isinstance(run, receipt.Run)
        assert all(isinstance(r, receipt.Record) for r in (run.records or {}).values())
        assert all(isinstance(e, receipt.TraceEvent) for e in (run.trace or []))


def test_a_script_receipts_script_reads_back_as_the_script():
    """A script receipt keeps its script parsed (settings.script) and as written (script_text)."""
    paths = [p for p in PATHS if p.name.endswith("-script" + store.SUFFIX)]
    assert paths
    for path in paths:
        st = receipt.Receipt.from_dict(store.read(path)).settings
        sc = Script.from_dict(st.script, st.script_text)
        assert json.loads(json.dumps(sc.to_dict())) == st.script and sc.text == st.script_text
        assert sc.streams[0].at.plus == st.script["streams"][0]["at"]["plus"] and sc.keys == st.figure_keys


def test_the_fields_are_typed_and_what_no_field_names_is_kept():
    d = {"schema": "tfbench.receipt/4", "scenario": "long-prompt", "partial": None, "future": {"x": 1},
         "runs": [{"index": 1, "variant": "base", "records": {"A": {"token_times": [1.5, 2.0], "new": 3}},
                   "trace": [{"t": 0.1, "kind": "cut"}], "server": "not a dict"}]}
    r = receipt.Receipt.from_dict(d)
    assert r.runs[0].records["A"].token_times == [1.5, 2.0] and r.runs[0].trace[0].kind == "cut"
    assert r.runs[0].records["A"].extra == {"new": 3} and r.extra == {"future": {"x": 1}}
    assert r.partial is None and r.settings is None and r.runs[0].server == "not a dict"
    assert r.holds("partial") and not r.holds("settings") and r.holds("future") and not r.holds("vocab")
    assert r.to_dict() == d and list(r.to_dict()) == list(d)  # partial present as None, settings absent
    r.runs[0].records["A"].error = "cut off"
    r.vocab = 7
    assert r.to_dict()["runs"][0]["records"]["A"]["error"] == "cut off" and r.to_dict()["vocab"] == 7
    assert r.holds("vocab") and not receipt.Receipt.from_dict({}) and receipt.Receipt.from_dict({"partial": None})
    assert r.to_dict() != d


def test_a_receipt_built_in_code_writes_the_fields_it_has():
    r = receipt.Receipt(schema="tfbench.receipt/4", host=receipt.Host(python="3.11"),
                        runs=[receipt.Run(index=1, records={"A": receipt.Record(token_ids=[1, 2])})])
    assert r.to_dict() == {"schema": "tfbench.receipt/4", "host": {"python": "3.11"},
                           "runs": [{"index": 1, "records": {"A": {"token_ids": [1, 2]}}}]}
    assert receipt.Receipt.from_dict(r.to_dict()) == r
