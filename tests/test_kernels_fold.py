"""The decode round's small kernels folded into their neighbours (engine/kernels.py, issue 14
round 5), run by Triton's interpreter on the CPU: each folded form gives the same bits as the
kernels it replaces, so a fold never moves a token. The interpreter computes in numpy, so a change
of the folded form's arithmetic order (a split merged out of order, a rounding moved) shows here."""
import pytest

pytest.importorskip("triton")


def test_combine_folded_into_split_attention_is_bitwise_the_two_kernels(interpret):
    """The last split program of a (row, KV head) to arrive merges the splits in order 0, 1, 2..:
    bitwise the separate combine kernel, for rows of 1, 2 and 3 splits (it reads every partial back
    from memory, so which split arrives last does not matter; the interpreter runs them in grid
    order); repeated launches give the same bits and leave every arrival counter at 0 (graph replays)."""
    interpret(r'''
import torch
import engine.kernels as K
K.SPLIT, K.BLOCK = 32, 16
g = torch.Generator().manual_seed(5)
layers, lanes_n, max_len, kvh, d = 2, 4, 96, 2, 16
class KV: pass
kv = KV()
kv.k = torch.randn(layers, lanes_n + 1, max_len, kvh, d, generator=g)
kv.v = torch.randn(layers, lanes_n + 1, max_len, kvh, d, generator=g)
q = torch.randn(5, 6, d, generator=g)  # 3 query heads a KV head (GROUP 3, padded to 16)
lanes = torch.tensor([0, 1, 2, 3, 4])
pos = torch.tensor([0, 31, 32, 70, 95])  # 1, 1, 2, 3 and 3 splits of 32
two = K.decode_attention(kv, 1, q, lanes, pos, fold=False)
one = K.decode_attention(kv, 1, q, lanes, pos, fold=True)
assert torch.equal(one, two), (one - two).abs().max()
assert torch.equal(K.decode_attention(kv, 1, q, lanes, pos, fold=True), one)
assert all(int(s[2].abs().sum()) == 0 for s in K._scratch.values())
# against the reference too (not bitwise): every head of every row written
from engine.model import decode_attention_loop
ref = decode_attention_loop(kv, 1, q, lanes, pos)
assert (one - ref).abs().max() < 1e-5
# bf16, as on the device
qb, kv.k, kv.v = q.bfloat16(), kv.k.bfloat16(), kv.v.bfloat16()
assert torch.equal(K.decode_attention(kv, 0, qb, lanes, pos, fold=True),
                   K.decode_attention(kv, 0, qb, lanes, pos, fold=False))
print("ok")
''')
