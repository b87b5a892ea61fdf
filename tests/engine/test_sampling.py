"""Seeded sampling keeps its ids: a sampled token depends only on (seed, position, its own logits).
Runner-level and host-level, tiny preset on the CPU."""
import math
from dataclasses import replace

import pytest
import torch

from engine.scheduler.backend import cuts
from engine.config import EngineConfig
from engine.scheduler.drafter import make_drafter
from engine.scheduler.host import LaneHost
from engine.runner.build import build_runner
from engine.runner.sampler import choose, draw
from engine.scheduler.sampling import SamplingParams, TokenLogprob, uniform
from engine.scheduler.sequence import Sequence, Status

R = 16
HOT = SamplingParams(temperature=1.0, seed=1234)


@pytest.fixture(scope="module")
def runner():
    return build_runner(EngineConfig(model="tiny", parallel=4, max_model_len=256, prefill_rows=R, seed=1))


def prompt(n, salt=0):
    return [(i * 37 + salt * 11 + 5) % 256 for i in range(n)]


# ---- the draw ---------------------------------------------------------------------------------
def test_uniform_is_a_pure_function_of_seed_and_position():
    a = [uniform(7, p) for p in range(2000)]
    assert a == [uniform(7, p) for p in range(2000)]
    assert all(0.0 <= u < 1.0 for u in a) and 0.45 < sum(a) / len(a) < 0.55
    assert [uniform(8, p) for p in range(50)] != a[:50]
    assert len(set(a)) == len(a)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(temperature=math.nan), dict(temperature=math.inf),
                                 dict(top_p=0), dict(top_p=1.5), dict(top_k=-1), dict(top_k=2.0),
                                 dict(seed=1.5), dict(logprobs=-1), dict(logprobs=True)])
def test_bad_params_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_draw_follows_top_k_top_p_and_the_distribution():
    logits = torch.tensor([0.0, 3.0, 1.0, 3.0, -2.0])
    at = lambda sp: [int(draw(logits, sp, p)) for p in range(400)]  # noqa: E731
    assert set(at(SamplingParams(temperature=1.0, top_k=1, seed=3))) == {1}  # ties: the lower id
    assert set(at(SamplingParams(temperature=1.0, top_k=2, seed=3))) == {1, 3}
    assert set(at(SamplingParams(temperature=1.0, top_p=0.5, seed=3))) == {1, 3}  # 1 alone has < 0.5
    counts = torch.bincount(torch.tensor(at(SamplingParams(temperature=1.0, seed=3))), minlength=5)
    p = torch.softmax(logits, 0)
    assert counts[4] <= 10 and abs(counts[1] / 400 - p[1]) < 0.08 and counts[0] + counts[2] > 0


def test_choose_keeps_greedy_rows_and_appends_logprobs():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]])
    lps = []
    out = choose(logits, [1, 0], [SamplingParams(logprobs=2), None], [4, 4], lps)
    assert out == [1, 0] and lps[1] is None  # greedy rows keep the runner's argmax
    want = torch.log_softmax(logits[0], 0).tolist()
    assert lps[0].logprob == pytest.approx(want[1])
    assert lps[0].top == [(1, pytest.approx(want[1])), (2, pytest.approx(want[2]))]
    hot = []
    picked = choose(logits, [1, 0], [replace(HOT, logprobs=0), replace(HOT, logprobs=0)], [4, 4], hot)
    assert [h.top for h in hot] == [[], []]
    assert hot[1].logprob == pytest.approx(torch.log_softmax(logits[1], 0)[picked[1]].item())


# ---- the runner -------------------------------------------------------------------------------
def test_temperature_zero_is_todays_greedy(runner):
    toks = prompt(29, 1)
    greedy = runner.generate(toks, 12)
    assert runner.generate(toks, 12, sampling=SamplingParams(seed=5)) == greedy
    lps = []
    runner.prefill(0, toks)
    first = runner.decode([0], [greedy[0]], [len(toks)], [SamplingParams(logprobs=3)], lps)
    assert first == [greedy[1]] and len(lps) == 1 and lps[0].top[0][0] == greedy[1]


def test_seeded_sampled_reply_differs_from_greedy_and_by_seed(runner):
    toks = prompt(20, 2)
    a = runner.generate(toks, 16, sampling=HOT)
    assert a == runner.generate(toks, 16, lane=3, sampling=HOT)  # replayed, another lane
    assert a != runner.generate(toks, 16)
    assert a != runner.generate(toks, 16, sampling=replace(HOT, seed=1235))


def test_sampled_alone_equals_beside_three_others_stepped(runner):
    target = prompt(3 * R + 5, 3)
    alone = runner.generate(target, 12, lane=0, sampling=HOT)
    others = [prompt(5, 4), prompt(40, 5), prompt(17, 6)]
    o_params = [SamplingParams(temperature=0.7, top_p=0.9, seed=9), SamplingParams(), replace(HOT, seed=77)]
    o_lanes = [0, 3, 1]
    o_out = [[runner.prefill(lane, p, sampling=sp)] for lane, p, sp in zip(o_lanes, others, o_params)]
    o_pos = [len(p) for p in others]

    def neighbours_round():
        res = runner.decode(o_lanes, [o[-1] for o in o_out], o_pos, o_params)
        for o, t in zip(o_out, res):
            o.append(t)
        o_pos[:] = [q + 1 for q in o_pos]

    for s, e in cuts(0, len(target), R):  # the target's prompt stepped in lane 2, rounds between
        first = runner.prefill_step(2, target, s, e, sampling=HOT)
        neighbours_round()
    out, pos = [first], len(target)
    for step in range(11):
        active = [0, 2] if 4 <= step < 8 else [0, 1, 2]  # neighbours come and go
        lanes = [2] + [o_lanes[i] for i in active]
        res = runner.decode(lanes, [out[-1]] + [o_out[i][-1] for i in active], [pos] + [o_pos[i] for i in active],
                            [HOT] + [o_params[i] for i in active])
        out.append(res[0])
        pos += 1
        for i, t in zip(active, res[1:]):
            o_out[i].append(t)
            o_pos[i] += 1
    assert out == alone
    assert o_out[1] == runner.generate(others[1], len(o_out[1]), lane=3)  # the greedy neighbour too


# ---- the lane host with the real runner ----------------------------------------------------------
def host_replies(runner, reqs, drafter=None, max_tokens=14, **cfg):
    """Run `reqs` [(prompt, SamplingParams, draft)] through a fresh host to the end; their outputs
    and the host."""
    conf = dict(model="tiny", parallel=4, max_model_len=256, prefill_rows=R, out_queue=1000)
    host = LaneHost(runner, EngineConfig(**{**conf, **cfg}), drafter=drafter)
    seqs = [Sequence(prompt=p, max_tokens=max_tokens, ignore_eos=True, sampling=sp, draft=d)
            for p, sp, d in reqs]
    for s in seqs:
        host.submit(s)
    while not all(s.done for s in seqs):
        host.turn()
    assert all(s.status == Status.FINISHED for s in seqs)
    return [s.output for s in seqs], host


@pytest.mark.parametrize("mode,share,cache", [("stepped", 1.0, True), ("whole", 1.0, False), ("stepped", 0.5, False)])
def test_host_sampled_reply_alone_equals_beside_three_others(runner, mode, share, cache):
    target = (prompt(4 * R + 3, 7), replace(HOT, top_k=50, top_p=0.95), True)
    (alone,), _ = host_replies(runner, [target], prefill_mode=mode, prefill_share=share, prompt_cache=cache)
    crowd = [(prompt(9, 8), SamplingParams(temperature=0.8, seed=5), True), target,
             (prompt(2 * R, 9), SamplingParams(), True), (prompt(30, 10), replace(HOT, seed=6), True)]
    together, _ = host_replies(runner, crowd, prefill_mode=mode, prefill_share=share, prompt_cache=cache)
    assert together[1] == alone
    assert alone == runner.generate(target[0], 14, sampling=target[1])  # and equal to the runner's own


def test_host_sampled_reply_keeps_its_ids_through_the_prompt_cache(runner):
    target = (prompt(3 * R + 4, 11), HOT, True)
    conf = EngineConfig(model="tiny", parallel=4, max_model_len=256, prefill_rows=R, out_queue=1000)
    host = LaneHost(runner, conf)
    replies = []
    for _ in range(2):  # the second reuses the first's lane and cuts
        s = Sequence(prompt=target[0], max_tokens=14, ignore_eos=True, sampling=HOT)
        host.submit(s)
        while not s.done:
            host.turn()
        replies.append(s)
    assert replies[1].cached == 3 * R and replies[1].output == replies[0].output


def test_host_sampled_reply_with_drafts_equals_undrafted(runner):
    """The ngram drafter's tokens are checked by equality with the row before: a sampled row's
    draw depends only on seed, position and logits, so accepted drafts are exactly what the
    undrafted reply samples."""
    rep = [(i % 9) * 11 + 3 for i in range(60)]  # a repetitive prompt gives the drafter matches
    cool = SamplingParams(temperature=0.05, seed=21)  # near-greedy: some drafts are accepted, some not
    (undrafted,), _ = host_replies(runner, [(rep, cool, False)], max_tokens=40)
    (drafted,), host = host_replies(runner, [(rep, cool, True)], drafter=make_drafter("ngram"), max_tokens=40)
    assert drafted == undrafted and host.counters.drafted > host.counters.accepted > 0  # kept and refused drafts
    (hot_undrafted,), _ = host_replies(runner, [(rep, HOT, False)], max_tokens=40)
    (hot_drafted,), host = host_replies(runner, [(rep, HOT, True)], drafter=make_drafter("ngram"), max_tokens=40)
    assert hot_drafted == hot_undrafted


def test_host_fills_a_missing_seed_and_logprobs_keep_step_with_the_output(runner):
    s = Sequence(prompt=prompt(12, 12), max_tokens=6, ignore_eos=True,
                 sampling=SamplingParams(temperature=1.0, logprobs=2))
    host = LaneHost(runner, EngineConfig(model="tiny", parallel=4, max_model_len=256, prefill_rows=R))
    emitted = []
    s.emit = lambda kind, payload: emitted.append((kind, payload, len(s.logprobs)))
    host.submit(s)
    while not s.done:
        host.turn()
        s.undrained = 0
    assert isinstance(s.sampling.seed, int)
    assert s.output == runner.generate(s.prompt, 6, sampling=s.sampling)  # replayable from the seed
    assert len(s.logprobs) == len(s.output) and all(len(lp.top) == 2 for lp in s.logprobs)
    tokens = [(p, n) for k, p, n in emitted if k == "token"]
    assert all(isinstance(p, int) and n == i + 1 for i, (p, n) in enumerate(tokens))  # set before each emit


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_rounds_sample_from_the_logits_the_graph_writes():
    """On CUDA the decode round stays one graph: greedy ids equal the eager round's, and a sampled
    reply is the same alone, beside others, and through eager rounds."""
    from engine.config import KernelConfig
    cfg = EngineConfig(model="tiny", device="cuda", dtype="float32", parallel=4, max_model_len=256, prefill_rows=R)
    g = build_runner(cfg)
    e = build_runner(replace(cfg, kernels=KernelConfig(cuda_graph=False)))
    assert g.graph is not None and e.graph is None
    p = prompt(37, 13)
    assert g.generate(p, 16) == e.generate(p, 16)
    alone = g.generate(p, 16, sampling=HOT)
    assert alone == e.generate(p, 16, sampling=HOT) and alone != g.generate(p, 16)
    others = [prompt(9, 14), prompt(50, 15), prompt(3, 16)]
    together = g.generate_together([p] + others, [1, 0, 2, 3], 16)  # greedy neighbours
    assert together[0] == g.generate(p, 16)
    lanes, params = [3, 0, 1, 2], [HOT, replace(HOT, seed=3), SamplingParams(), replace(HOT, top_k=5)]
    outs = [[g.prefill(lane, q, sampling=sp)] for lane, q, sp in zip(lanes, [p] + others, params)]
    pos = [len(q) for q in [p] + others]
    for _ in range(15):
        for o, t in zip(outs, g.decode(lanes, [o[-1] for o in outs], pos, params)):
            o.append(t)
        pos = [q + 1 for q in pos]
    assert outs[0] == alone
