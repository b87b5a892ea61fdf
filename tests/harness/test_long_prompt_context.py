"""The long-prompt test's context holds A's reply past B's and C's sends: sized before launch, and
a run where A still ended before B's first token refuses the rest, naming the flag."""
import pytest

from tensorfold_bench.client.stream import StreamRecord
from tensorfold_bench.errors import FlagError
from tensorfold_bench.scenarios import long_prompt as lp


def settings(**kw):
    args = dict(model="tiny", device="cpu", dtype=None, share="1,0.5", order=None, url=None, out_dir="r",
                plain_check=False, parallel=None, prefill_rows=None, max_model_len=None, seed=0, trace=False,
                engine_args=None, b_at=1.0, c_after=0.3, b_tokens=1024, c_tokens=34, a_tokens=None)
    return lp.settings_from_flags(**{**args, **kw})


def test_the_context_holds_as_many_of_as_tokens_as_the_fastest_preset_decodes_before_b_and_c():
    s = settings()
    # 1,500 tokens/s over 1 + 0.3 + 1 s: 3,450 tokens of A's reply, beside its 16-token prompt
    assert s.session.engine.max_model_len == 3584 and s.script.a_max_tokens == 3584 - 16 - 1
    assert s.script.a_max_tokens >= lp.A_TOKENS_PER_S * (s.script.b_at + s.script.c_after)
    big_b = settings(b_tokens=8000)  # B's own prompt can ask for more
    assert big_b.session.engine.max_model_len == 8192
    assert settings(max_model_len=2048).session.engine.max_model_len == 2048  # as given
    assert settings(a_tokens=100).session.engine.max_model_len == 1280  # A's reply as given, B's prompt
    with pytest.raises(FlagError, match="--a-tokens"):
        settings(a_tokens=3000, max_model_len=2048)


def record(name, sent, times, *, cancelled=False):
    return StreamRecord(name, "/v1/completions", 16, len(times), sent=sent, token_times=list(times),
                        token_ids=[1] * len(times), cancelled=cancelled)


def test_a_that_ends_before_bs_first_token_refuses_the_run_naming_the_flag():
    script = lp.LongPromptScript(b_at=1.0, c_after=0.3, b_tokens=1024, a_max_tokens=1263)
    a_times = [0.001 * (i + 1) * 0.8 for i in range(1263)]  # 1,250 tokens/s: done 1.01 s in
    b = record("B", 1.0, [1.2])
    with pytest.raises(FlagError, match="--max-model-len") as e:
        lp.check_a_outlasts({"A": record("A", 0.0, a_times), "B": b}, script, 1280)
    assert "reached the server's max_model_len 1280" in str(e.value)
    need = int(str(e.value).split("give --max-model-len ")[1].split()[0])
    assert need % 256 == 0 and need >= 16 + 1250 * 2 * 2.2  # twice A's pace over B's first token plus slack
    # A still decoding when B's first token came (cancelled after B and C): nothing to refuse
    lp.check_a_outlasts({"A": record("A", 0.0, a_times[:1000] + [1.3], cancelled=True), "B": b}, script, 1280)
    lp.check_a_outlasts({"A": record("A", 0.0, a_times + [1.25]), "B": b},
                        lp.LongPromptScript(b_at=1.0, c_after=0.3, b_tokens=1024, a_max_tokens=1264), 1280)
