"""A prompt cut's attention on the CPU (engine/cpu/cut_attention.py): the causal attention of the
reference, and a row's bits set by its own position and keys only, whatever the cuts, the other
rows, or the cache rows past the prompt, in bfloat16 and float32."""
import pytest
import torch

from engine.cpu.cut_attention import TILE, cut_attention_cpu
from engine.models.qwen3 import prefill_attention

H, KVH, D, L = 4, 2, 16, 160  # heads, KV heads, head_dim, cache rows of the lane
DTYPES = [torch.float32, torch.bfloat16]


def lane(dtype, n=L, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, H, D, generator=g).to(dtype)
    k = torch.randn(n, KVH, D, generator=g).to(dtype)
    v = torch.randn(n, KVH, D, generator=g).to(dtype)
    return q, k, v


def in_cuts(q, k, v, bounds, tile):
    """The rows [bounds[0], bounds[-1]) as cuts between consecutive bounds, one call each."""
    return torch.cat([cut_attention_cpu(q[a:b], k, v, a, tile) for a, b in zip(bounds, bounds[1:])])


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_bits_do_not_depend_on_the_cuts(dtype):
    """Whole, in cuts of 16 or 40 rows, in ragged cuts that start and end mid-tile, resumed from
    row 48: every row bitwise equal. The split at the cut's own start that this replaced (keys
    before the cut, the cut's square block, merged) failed this in float32."""
    q, k, v = lane(dtype)
    n, tile = 150, 32
    whole = in_cuts(q, k, v, [0, n], tile)
    for bounds in ([0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 150], [0, 40, 80, 120, 150],
                   [0, 5, 37, 38, 90, 91, 150], [0, 1, 2, 3, 150]):
        assert torch.equal(in_cuts(q, k, v, bounds, tile), whole), bounds
    assert torch.equal(in_cuts(q, k, v, [48, 70, n], tile), whole[48:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_bits_do_not_depend_on_other_rows_or_stale_cache_rows(dtype):
    """Row 70 alone, then beside other rows whose queries differ, then with the cache rows past
    the prompt's end (read by the last tile, masked) holding other finite values."""
    q, k, v = lane(dtype)
    row = cut_attention_cpu(q[70:71], k, v, 70, 32)
    q2 = q.clone()
    q2[64:70] *= -3
    q2[71:96] += 1
    assert torch.equal(cut_attention_cpu(q2[64:96], k, v, 64, 32)[6], row[0])
    k2, v2 = k.clone(), v.clone()
    k2[71:], v2[71:] = 50.0, -7.0
    assert torch.equal(cut_attention_cpu(q[70:71], k2, v2, 70, 32), row)
    assert torch.equal(cut_attention_cpu(q[60:71], k2, v2, 60, 32)[-1], row[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start,t,tile", [(0, 16, 32), (16, 16, 32), (48, 7, 32), (5, 1, 32), (0, 150, 32),
                                          (30, 100, TILE), (0, L, L)])
def test_is_the_reference_causal_attention(dtype, start, t, tile):
    """Against engine.models.qwen3.prefill_attention (SDPA, causal at the bottom right) in float32 on
    the same inputs: float32 to rounding, bfloat16 within its scores' and probabilities' rounding."""
    q, k, v = lane(dtype)
    end = start + t
    got = cut_attention_cpu(q[start:end], k, v, start, tile)
    ref = prefill_attention(q[start:end].float(), k[:end].float(), v[:end].float(), start)
    assert got.dtype == dtype and got.shape == (t, H * D)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), ref, rtol=tol, atol=tol)


def test_the_cache_end_clips_the_last_tile():
    """A lane whose rows end mid-tile: the last tile is shorter, still causal and exact."""
    q, k, v = lane(torch.bfloat16, n=100)
    whole = cut_attention_cpu(q, k, v, 0, 64)
    assert torch.equal(in_cuts(q, k, v, [0, 70, 99, 100], 64), whole)
    ref = prefill_attention(q.float(), k.float(), v.float(), 0)
    torch.testing.assert_close(whole.float(), ref, rtol=3e-2, atol=3e-2)
