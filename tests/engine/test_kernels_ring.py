"""The decode products' TMA ring (engine/cuda/ring.py): which products it takes, that the round
hands them over with the Triton kernel's K ranges (its bits: the ring sums in the same order, checked
bitwise on the H200 by tools/ring_probe.py and tools/gpu_check.py), and, where this
Triton's Gluon is the one it is written for (3.6), its device code compiled for sm_90 on the CPU:
the weights staged before the grid-dependency wait, x only after it, no spills."""
import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")

import engine.cuda.ring as R  # noqa: E402
import engine.cuda.skinny as S  # noqa: E402
from engine.cuda.launch import PLAIN, LaunchMode  # noqa: E402


def test_it_takes_the_measured_shapes_at_up_to_8_rows():
    assert R.plan(6144, 4096, 8, 1, False) == (192, 32)      # qwen3-8b q/k/v: 192 tiles of 32 columns
    assert R.plan(4096, 12288, 1, 2, False) == (128, 32)     # down in the split-K kernel's two K ranges
    assert R.plan(24576, 4096, 4, 1, True) == (768, 16)      # gated: 16 columns of gate and of up a tile
    assert R.plan(6144, 4096, 9, 1, False) is None           # a round of 16 rows: Triton's
    assert R.plan(151936, 4096, 8, 1, False) is None         # lm_head: measured no faster
    assert R.plan(5120, 8192, 4, 1, False) is None           # qwen3-32b's o: measured slower
    assert R.plan(4096, 12288, 8, 16, False) is None         # K ranges of 6 stages: 8 are staged before the wait


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_not_on_a_machine_without_hopper():
    assert not R.supported() and not R.Ring().available()
    x, w = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.zeros(6144, 4096, dtype=torch.bfloat16)
    assert not R.takes(x, w, 1)


def test_the_round_hands_products_over_with_the_triton_configs_k_ranges(monkeypatch):
    calls = []
    monkeypatch.setattr(R, "takes", lambda x, w, split, gated=False: True)
    monkeypatch.setattr(R, "supported", lambda: True)
    ring = R.Ring()
    monkeypatch.setattr(ring, "try_product", lambda x, w, split=1, gated=False, pdl=False, out=None:
                        calls.append((tuple(w.shape), split, gated, pdl)) or torch.zeros(1))
    x, x3 = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.zeros(8, 12288, dtype=torch.bfloat16)
    qkv, down = torch.empty(6144, 4096, dtype=torch.bfloat16), torch.empty(4096, 12288, dtype=torch.bfloat16)
    gate_up = torch.empty(24576, 4096, dtype=torch.bfloat16)
    # down in two K ranges (the H200's tables sum it in one chain): the ring must take the config's ranges
    tables = S.H200.with_entries([(4096, 12288, 16, {"block_n": 32, "block_k": 128, "split_k": 2})])
    on = dict(tables=tables, ring=ring)
    m = LaunchMode(pdl=3, ring=True, interpret=False)
    S.linear(x, qkv, mode=m, **on), S.linear(x3, down, mode=m, **on), S.gate_up_silu(x, gate_up, mode=m, **on)
    S.linear(x, qkv, mode=LaunchMode(ring=True, interpret=False), **on)
    assert calls == [((6144, 4096), 1, False, True),
                     ((4096, 12288), 2, False, True),
                     ((24576, 4096), 1, True, True), ((6144, 4096), 1, False, False)]
    assert S.config_for(4096, 12288, 8, tables).split_k == 2
    calls.clear()
    monkeypatch.setattr(S, "_launch", lambda *a, **kw: None)
    S.linear(x, qkv, mode=PLAIN, **on), S.linear(x, qkv, mode=m, tables=tables)  # plain, or no ring given
    assert calls == []


def test_a_ring_that_fails_hands_every_product_back_to_triton(monkeypatch):
    """A compile or launch error of the ring (another Triton's Gluon, say) must not cost the decode graph:
    the Triton kernel runs that product, and the ring is off for the rest of that runner (another
    runner's ring is its own)."""
    def boom(*a, **kw):
        raise RuntimeError("no such Gluon op")
    monkeypatch.setattr(R, "product", boom)
    monkeypatch.setattr(R, "supported", lambda: True)
    ring, other = R.Ring(), R.Ring()
    x, w = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.zeros(6144, 4096, dtype=torch.bfloat16)
    assert ring.available()
    assert ring.try_product(x, w) is None
    assert not ring.available() and "no such Gluon op" in ring.broken[0]
    assert other.available() and not other.broken


def _compile(split, gated, pdl, nb):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    wl = R.layout()
    sig = {"wd": f"tensordesc<bf16[{nb}, 128],{wl!r}>", "xd": f"tensordesc<bf16[8, 64],{wl!r}>", "Y": "*bf16",
           "M": "i32", "T": "i32", "I": "i32", "K": "i32", "stride_y": "i32"}
    src = GluonASTSource(fn=R.ring_kernel, signature=sig,
                         constexprs={"SPLIT": split, "GATED": gated, "PDL": pdl, "S": 8 if pdl else 0, "NB": nb})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def ln_order(line: str) -> list[str]:
    return [w.strip() for w in line.split(";") if "griddepcontrol" in w]


@pytest.mark.skipif(not R.HAVE_GLUON, reason="the ring is written for triton 3.6's Gluon (the H200's)")
@pytest.mark.parametrize("split,gated,pdl", [(1, False, True), (2, False, True), (1, True, True), (1, False, False)])
def test_device_code_stages_weights_before_the_wait_and_x_after(split, gated, pdl):
    k = _compile(split, gated, pdl, 16 if gated else 32)
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    if not pdl:
        assert "griddepcontrol" not in ptx
        return
    lines = [ln for ln in ptx.splitlines() if "cp.async.bulk.tensor" in ln or "griddepcontrol" in ln]
    wait = next(i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln)
    assert ln_order(lines[wait]) == ["griddepcontrol.wait", "griddepcontrol.launch_dependents"]
    # 8 stages of W before it, a [NB, 128] box copied as two of 64 columns (gated: gate's and up's),
    # then the 8 stages' x (two boxes of 64 columns each)
    assert wait == 8 * 2 * (2 if gated else 1)
    assert all("cp.async.bulk.tensor" in ln for ln in lines[wait + 1:wait + 1 + 16])
    assert sum("griddepcontrol" in ln for ln in lines) == 1
    assert k.metadata.shared <= 227 * 1024
