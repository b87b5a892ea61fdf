"""The CPU's mixed forward (ModelRunner.mixed): a prompt's cut and a decode round in one forward,
every row with the bits it has in its own call. Checked bit for bit on the KV rows a prompt leaves
and on the round's logits, with cuts off the grid, beside other lanes, and below the products'
row-invariance floor."""
import pytest
import torch

from engine.config import EngineConfig, KernelConfig
from engine.cpu.forward import CpuOps, mixed_products
from engine.cpu.packed import invariant_floor
from engine.models.qwen3 import ForwardPlan
from engine.runner.build import build_runner
from marks import bf16
from tiny_run import LONG_PROMPT

R = 64
B = [(i * 29 + 3) % 500 for i in range(300)]  # 4 full grid cuts and a last one of 44 rows
A = [(i * 37 + 11) % 500 for i in range(40)]


def runner(mode="mixed", dtype="float32", model="tiny", parallel=4, wide=None):
    return build_runner(EngineConfig(model=model, dtype=dtype, parallel=parallel, max_model_len=512,
                                     prefill_rows=R, prefill_mode=mode, seed=7, kernels=KernelConfig(cpu_wide=wide)))


def kv_rows(r, lane, n):
    return r.kv.k[:, lane, :n].clone(), r.kv.v[:, lane, :n].clone()


@pytest.mark.parametrize("wide", [None, False])
def test_the_floor_is_found_on_this_cpu_and_mixed_cuts_may_leave_the_grid(wide):
    """With the engine's default products and with float32 weights through MKL: the cuts' product
    has a floor, so mixed cuts may end anywhere; where the round's products are the wide kernel's,
    its rows keep their own product (they never share MKL's)."""
    r = runner(wide=wide)
    assert r.cpu.mix_floor is not None and r.cut_free
    assert invariant_floor(r.cpu.packed, R) == r.cpu.mix_floor
    assert not runner("stepped", wide=wide).cut_free  # checked only where mixed forwards run
    shared = ("one product over the cuts' rows, the round's rows in the wide kernel" if r.cpu.packed.wide is not None
              else "one product over every row")
    assert r.describe()["cpu_mixed"].startswith(f"{shared} (row-invariant from {r.cpu.mix_floor} rows)")


@pytest.mark.parametrize("dtype,model", [("float32", "tiny"), ("float32", "cpu"), bf16(("bfloat16", "cpu"))])
def test_cuts_off_the_grid_beside_a_round_leave_the_reference_bits(dtype, model):
    """B filled by a whole prefill alone, against B filled in cuts of 48, 100, 7, 101 rows (off
    the grid), each beside a decode round of A, then its last grid cut beside A too: the same KV
    rows bit for bit, the same first token; and A's tokens those of A alone. Where the start-up
    check finds no row-invariant floor for this machine's products (MKL's float32 at the cpu
    preset's shapes on an AVX-512 Xeon), the runner is not cut_free and the host keeps cuts on the
    grid: then the grid's cuts, each beside a round."""
    ref = runner("whole", dtype, model)
    first = ref.prefill(1, B)
    ref_kv = kv_rows(ref, 1, len(B))
    a_alone = ref.generate(A, 7, lane=0)

    r = runner("mixed", dtype, model)
    a = [r.prefill(0, A)]
    # 256: the last grid cut starts there and runs whole
    bounds = [0, 48, 148, 155, 256, 300] if r.cut_free else [0, 64, 128, 192, 256, 300]
    got = None
    for s, e in zip(bounds, bounds[1:]):
        (got,), ids = r.mixed([(1, B, s, e)], [0], [a[-1]], [len(A) + len(a) - 1])
        a += ids
    assert got == first
    for x, y in zip(kv_rows(r, 1, len(B)), ref_kv):
        assert torch.equal(x, y)
    assert a[:6] == a_alone[:6]


def test_a_round_s_logits_beside_a_cut_are_its_logits_alone():
    """The decode rows' logits from a mixed forward (engine/cpu/forward.py) against the plain round's, bit for bit, with a cut of
    3 rows (below the fp32 floor: multiplied alone) and one of 90."""
    r = runner()
    r.prefill(0, A)
    r.prefill(2, A[:20])
    lanes, toks, pos = [0, 2], [5, 9], [len(A), 20]
    rows, where = r.padded_round(lanes, toks, pos)
    with torch.inference_mode():
        alone = r._decode_body(torch.tensor(rows), rows=list(zip(rows[2], rows[1])))[where].clone()
        for n in (3, 90):
            r2 = runner()
            r2.prefill(0, A)
            r2.prefill(2, A[:20])
            if r2.cpu.attention is None:
                pytest.skip("no C compiler: the bucketed attention")
            plan = ForwardPlan.of([(torch.tensor(B[:n]), 1, 0)], torch.tensor(rows))
            attend = lambda i, q: r2.cpu.attention(r2.kv.k[i], r2.kv.v[i], q, torch.tensor(rows[2]), torch.tensor(rows[1]), r2.spare)  # noqa: E731
            ops = CpuOps(r2.model, r2.kv, plan, r2.cpu.packed, mixed_products(r2.cpu.packed, plan, r2.cpu.mix_floor, [True]),
                         r2.cpu.cut_attention, pad=True, round_attention=attend)
            logits = r2.cpu.packed.mm_tiled(r2.model(plan, ops)[plan.n:], "lm_head")
            assert torch.equal(logits[where], alone)


def test_each_product_per_part_when_no_floor_holds():
    """floor None (a CPU whose products part by row count): each cut and the round's tiles
    multiplied alone, the same bits as with the floor on this CPU."""
    r = runner()
    r.prefill(0, A)
    ref = runner("whole").prefill(1, B[:100])
    r.cpu.mix_floor = None
    (first,), _ = r.mixed([(1, B[:100], 0, 64)], [0], [3], [len(A)])
    (first,), _ = r.mixed([(1, B[:100], 64, 100)], [0], [4], [len(A) + 1])
    assert first == ref


def test_bad_mixed_forwards_are_refused():
    r = runner()
    r.prefill(0, A)
    with pytest.raises(ValueError, match="twice"):
        r.mixed([(0, B, 0, 10)], [0], [1], [len(A)])
    with pytest.raises(ValueError, match="bad cut"):
        r.mixed([(1, B, 10, 5)], [0], [1], [len(A)])


def test_long_prompt_runs_mixed_variants_through_the_real_server_with_every_reply_equal(tmp_path):
    """tfbench's long-prompt on the tiny preset: whole and mixed side by side on fresh
    servers, then the plain reference; every reply equal, and the mixed server's trace shows its
    forwards carrying B's cuts beside A."""
    from typer.testing import CliRunner

    from tensorfold_bench import report
    from tensorfold_bench.cli.commands import app

    variants = tmp_path / "v.yaml"
    variants.write_text("- name: whole\n  flags: --prefill-mode whole\n"
                        "- name: mixed budget=4\n  flags: --prefill-mode mixed --mixed-budget 4\n")
    res = CliRunner().invoke(app, ["run", "long-prompt", *LONG_PROMPT, "--variants", str(variants), "--plain-check",
                                   "--order", "whole,mixed budget=4", "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    data = report.read(next(tmp_path.glob("*-long-prompt.json.gz")))
    for cmp in list(data["exactness"]["vs_plain"].values()) + list(data["exactness"]["across_runs"].values()):
        assert all(c["equal"] for c in cmp), cmp
    hashes = data["exactness"]["hashes"]
    for k in "ABC":
        assert len({h[k] for h in hashes.values()}) == 1, (k, hashes)
    mixed = next(r for r in data["runs"] if r["variant"] == "mixed budget=4")
    steps = [s for s in mixed["trace"] if s["kind"] == "mixed"]
    assert len(steps) >= 5 and all(s["streams"] >= 1 for s in steps)
    assert all(s["kind"] != "mixed" for r in data["runs"] if r is not mixed for s in r["trace"])


def test_a_last_cut_below_the_floor_keeps_the_bits_prefill_step_gives_it():
    """A prompt of 130 tokens ends in a 2-row grid cut, which prefill_step multiplies at 2 rows
    (another MKL kernel than 4 or more): beside a round it is multiplied alone, so its KV rows and
    first token are the reference's."""
    p = B[:130]
    ref = runner("whole")
    first = ref.prefill(1, p)
    ref_kv = kv_rows(ref, 1, len(p))
    r = runner()
    a = r.prefill(0, A)
    r.prefill_step(1, p, 0, 128)
    (got,), _ = r.mixed([(1, p, 128, 130)], [0], [a], [len(A)])
    assert got == first
    for x, y in zip(kv_rows(r, 1, len(p)), ref_kv):
        assert torch.equal(x, y)
