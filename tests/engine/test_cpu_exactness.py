"""A CPU decode round's logits, bit for bit, whatever else the round holds (float32 and bfloat16).

Equal greedy ids are not enough: a sampled draw turns any bit of a row's logits into a token
sooner or later. A sampled float32 long-prompt run (T=1.0, seed 1234) once had A part from the
plain reference at token 267: the reference ran --parallel 1,
so its rounds multiplied 1 row by weights packed for 1 row, and the server's rounds 4 rows by
weights packed for 4; MKL's packed sgemm has one kernel for 1 to 3 rows and another for 4 or
more (whose rows keep their bits at any row count and place), which round differently: A's logits
differed by up to 2e-6 from the first round, and A's draw at token 267 fell between the two. A alone on a
--parallel 4 runner gives the same token 235 (scripts/cpu_exactness_replay.py replays it); the
prompt steps played no part. Rounds of whole 8-row tiles (engine.cpu.packed.ROW_TILE) fixed it."""
import pytest
import torch

from engine.config import EngineConfig
from engine.cpu.packed import ROW_TILE
from engine.runner.build import build_runner
from engine.runner.sampler import choose, draw
from engine.scheduler.sampling import SamplingParams
from marks import bf16, needs_cpu_bf16  # noqa: F401

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
FED = [5, 301, 77, 460]  # the tokens fed to the rounds after the prompt


def runner(dtype, parallel, model="cpu"):
    return build_runner(EngineConfig(model=model, dtype=dtype, parallel=parallel, max_model_len=128,
                                     prefill_rows=64, seed=1234))


def lane_logits(r, lane, others=()):
    """`lane`'s logits over len(FED) rounds after PROMPT; `others`: (lane, position) rows beside it."""
    r.prefill(lane, PROMPT)
    out = []
    for i, t in enumerate(FED):
        lanes = [lane, *(o for o, _ in others)]
        positions = [len(PROMPT) + i, *(q + i for _, q in others)]
        rows, where = r.padded_round(lanes, [t] * len(lanes), positions)
        with torch.inference_mode():
            logits = r._decode_body(torch.tensor(rows), rows=list(zip(rows[2], rows[1])))
        out.append(logits[where[0]].clone())
    return torch.stack(out)


# the tiny preset shows float32's two kernels; bf16's show on the cpu preset's shapes only
@pytest.mark.parametrize("dtype,model", [("float32", "tiny"), bf16(("bfloat16", "cpu"))])
def test_round_logits_do_not_depend_on_the_lane_count_or_lane(dtype, model):
    """The plain reference's one lane against a server's lanes: --parallel 4 (one 8-row tile),
    and lane 9 of --parallel 11 (row 1 of a 16-row round's second tile, beside two neighbours,
    one of its own span). Before 8-row tiles (engine 9799600) both dtypes differed from the first
    round."""
    ref = lane_logits(runner(dtype, 1, model), 0)
    assert torch.equal(lane_logits(runner(dtype, 4, model), 0), ref)
    crowded = runner(dtype, 11, model)
    for lane, n in ((2, 40), (6, 100)):
        crowded.prefill(lane, [(i * 13 + lane) % 500 for i in range(n)])
    assert torch.equal(lane_logits(crowded, 9, others=((2, 40), (6, 100))), ref)


@pytest.mark.parametrize("dtype", [torch.float32, bf16(torch.bfloat16)])
def test_a_row_s_product_does_not_depend_on_its_place_in_the_tile(dtype):
    """MKL (float32) and oneDNN (bf16) kernels work on register blocks of rows, with edge
    kernels for the rest: a row must get the same bits at every place of a round's tiles, beside
    any other rows. Any change to how a round multiplies (PackedLinears.mm) must keep this."""
    r = runner("float32" if dtype == torch.float32 else "bfloat16", 1)
    g = torch.Generator().manual_seed(0)
    for key in ((0, "qkv"), (0, "o"), (0, "gate_up"), (0, "down"), "lm_head"):
        k = r.cpu.packed.plain[key].shape[1]
        x = torch.randn(k, generator=g).to(dtype)
        outs = []
        for place in range(2 * ROW_TILE):  # a round of two tiles (--parallel 9 to 16)
            for fill in (torch.zeros, lambda *s: torch.randn(*s, generator=g)):
                tiles = fill(2 * ROW_TILE, k).to(dtype)
                tiles[place] = x
                outs.append(r.cpu.packed.mm_tiled(tiles, key)[place])
        assert all(torch.equal(o, outs[0]) for o in outs), key


def test_a_draw_reads_only_its_own_row():
    """The seeded sampler on one row of a round's logits gives the token of that row alone."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(ROW_TILE, 512, generator=g)
    sp = SamplingParams(temperature=1.0, seed=77)
    picked = choose(logits[[5, 0, 2]], [0, 0, 0], [sp] * 3, [50, 51, 52])
    assert picked == [int(draw(logits[i].clone(), sp, q)) for i, q in ((5, 50), (0, 51), (2, 52))]
