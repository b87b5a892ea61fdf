"""Prompt cuts run in turn on a runner's lanes, for the tests that hold cuts equal across schedules
(torch imported on use: these tests load it only when they run)."""


def cut_in_turn(r, ids, lane, spans):
    """The fused trunk's logits of `ids` cut at `spans` ([(start, end), ...]) on `lane`, in order."""
    import torch
    return torch.cat([r.cut_logits(ids[s:e], lane, s, fused=True) for s, e in spans])


def resumed(r, ids, rows=16, lane=2):
    """Lane 0's first `rows` KV rows copied to `lane` (a cached prefix), then the rest cut on it."""
    r.kv.k[:, lane, :rows], r.kv.v[:, lane, :rows] = r.kv.k[:, 0, :rows], r.kv.v[:, 0, :rows]
    return cut_in_turn(r, ids, lane, [(rows, 32), (32, 40)])
