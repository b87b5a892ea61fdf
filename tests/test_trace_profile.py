"""tools/trace_profile.py: a profile rebuilt from a run's trace, on a trace written by hand."""
import gzip
import json

from tools.trace_profile import Run, decode_sms, fit


def step(t, dur, kind, rows, streams, seq):
    return {"t": t, "dur": dur, "kind": kind, "rows": rows, "streams": streams, "seq": seq}


RECORDS = [{"prompt_len": 16, "max_tokens": 1000, "sent": 0.0}, {"prompt_len": 2048, "max_tokens": 3, "sent": 1.0}]


def test_cuts_and_rounds_get_their_start_and_keys():
    trace = [step(0.0, 0.02, "prefill", 16, 1, 0),  # the fresh server's first request: left out
             step(0.0201, 0.005, "decode", 1, 1, None),  # A: 16 + 1 keys
             step(1.0, 0.03, "prefill", 1024, 1, 1),
             step(1.0301, 0.005, "decode", 1, 1, None),  # A: 18
             step(1.0352, 0.04, "prefill", 1024, 1, 1),  # B's last cut: B decodes from here
             step(1.0753, 0.006, "decode", 2, 2, None),  # A 19 + B 2049
             step(1.0814, 0.006, "decode", 2, 2, None)]  # A 20 + B 2050: B has its 3 tokens
    s = Run(trace, RECORDS, None).samples()
    assert s["prefill"] == [[1024, 0, 0.03], [1024, 1024, 0.04]]
    assert s["decode"] == [[1, 17, 0.005], [1, 18, 0.005], [2, 19 + 2049, 0.006], [2, 20 + 2050, 0.006]]
    assert s["split"] == [] and s["mixed"] == []
    # the gaps after one-stream rounds (0.1 ms) and two-stream ones (0.1 ms): the host's own time
    turn, token = dict(s["host"])["turn"], dict(s["host"])["token"]
    assert 0 < turn < 0.002 and token == 0.0


def test_split_cuts_take_their_own_time_and_the_rounds_inside():
    # two cuts in flight: the second launched at once and queued behind the first
    trace = [step(0.0, 0.001, "prefill", 16, 1, 0), step(0.002, 0.005, "decode", 1, 1, None),
             step(1.0, 0.10, "prefill", 1024, 1, 1), step(1.0, 0.18, "prefill", 1024, 1, 1)]
    trace += [step(1.0 + 0.01 * i, 0.009, "decode", 1, 1, None) for i in range(17)]
    s = Run(trace, RECORDS, 40).samples()
    (first, second) = s["split"]
    assert first[:3] == [40, 1024, 0] and abs(first[5] - 0.10) < 1e-9 and abs(first[6] - 0.009) < 1e-9
    assert second[:3] == [40, 1024, 1024] and abs(second[5] - 0.08) < 1e-9  # landing less the first's landing
    assert s["prefill"] == []  # cuts on the prompt partition are not whole-device cuts
    assert all(r[0] == 1 for r in s["decode"]) and len(s["decode"]) == 1  # only the round outside every cut


def test_mixed_forwards_and_prompts_filled_together():
    trace = [step(0.0, 0.001, "prefill", 16, 1, 0), step(0.002, 0.005, "decode", 1, 1, None),
             step(1.0, 0.012, "mixed", 256, 1, 1), step(1.0, 0.012, "prefill", 256, 1, 1),  # traced twice
             step(2.0, 0.02, "prefill", 64, 1, 2), step(2.0, 0.02, "prefill", 32, 1, 3)]
    recs = RECORDS + [{"prompt_len": 64, "max_tokens": 4, "sent": 2.0}, {"prompt_len": 32, "max_tokens": 4, "sent": 2.0}]
    s = Run(trace, recs, None).samples()
    assert s["mixed"] == [[256, 0, 1, 18, 0.012]]
    assert s["prefill_many"] == [[2, 96, 0.02]] and s["prefill"] == []


def test_fit_reads_a_receipt_and_names_its_source(tmp_path):
    trace = [step(0.0, 0.02, "prefill", 16, 1, 0), step(1.0, 0.03, "prefill", 1024, 1, 1)]
    trace += [step(1.1 + 0.006 * i, 0.005, "decode", 1, 1, None) for i in range(5)]
    eng = {"device": "cuda", "device_name": "NVIDIA H200", "compute_capability": "9.0", "model": "qwen3-8b",
           "dtype": "bfloat16", "shape": {"hidden": 4096, "layers": 36, "heads": 32, "kv_heads": 8, "head_dim": 128,
                                          "intermediate": 12288, "vocab": 151936}}
    receipt = {"variants": [{"name": "split sms=24", "args": ["--prefill-mode", "split", "--decode-sms", "24"]},
                            {"name": "whole", "args": ["--prefill-mode", "whole"]}],
               "settings": {"engine": {"parallel": 4, "prefill_rows": 1024, "max_model_len": 32256},
                            "engine_flags": ["--model", "qwen3-8b"]},
               "runs": [{"index": 1, "variant": "whole", "trace": trace, "engine": {"engine": eng, "commit": "abc"},
                         "records": {"A": RECORDS[0], "B": {**RECORDS[1], "max_tokens": 8}}, "figures": {"valid": True}}],
               "alone": {}}
    path = tmp_path / "20261207-000000-long-prompt.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(receipt, f)
    doc = fit([path])
    assert doc["schema"] == "tfbench.profile/1" and doc["source"].startswith("fitted from receipt traces: 20261207")
    assert doc["device"]["name"] == "NVIDIA H200" and doc["engine"]["commit"] == "abc"
    assert doc["samples"]["prefill"] == [[1024, 0, 0.03]] and len(doc["samples"]["decode"]) == 5
    assert decode_sms(receipt["variants"][0]["args"]) == 24 and decode_sms(["--prefill-mode", "whole"]) is None
