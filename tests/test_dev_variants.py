"""tools/variants.py: the decode-graph variants the A/B probe captures in turn in one runner. A
setting left behind would run under every later variant's name and mislabel its figures."""
import pytest

import engine.cuda.decode_attention as K
import engine.cuda.fused as KF
import engine.cuda.prefetch as P
import engine.cuda.ring as R
import engine.cuda.skinny as S
from engine.runner import decode_graph
from engine.config import EngineConfig, KernelConfig
from tools.variants import VARIANTS, applied


def state():
    return (dict(R.STAGED), dict(R.PROGRAMS), dict(S.CONFIGS), dict(S.GATED), P.PREFETCH_ROWS, K.GRID_PER_SM,
            K.WARPS, dict(K.STAGES), set(K.LOADS_FIRST), KF.embed_rmsnorm, decode_graph.argmax)


def value(obj, key):
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_variant_holds_inside_its_capture_and_is_undone_after(name):
    before = state()
    with applied(name) as knobs:
        KernelConfig(**knobs)  # its knobs are KernelConfig's fields
        assert all(value(obj, key) == v for obj, key, v in VARIANTS[name].sets)
    assert state() == before


def test_a_variant_is_undone_when_its_capture_fails():
    before = state()
    with pytest.raises(RuntimeError):
        with applied("og64"):
            assert S.GATED[(24576, 4096, 64)] == S.SkinnyConfig(32, 128, 4, 6)
            raise RuntimeError("capture failed")
    assert state() == before and (24576, 4096, 64) not in S.GATED


def test_recapture_bakes_a_variant_in_from_the_config_before_any():
    """recapture: the graphs captured while the variant's settings hold, its knobs on the base config
    (not on the last variant's), the settings undone after."""
    from types import SimpleNamespace

    from tools.variants import recapture
    seen = []
    r = SimpleNamespace(capture_graph=lambda: seen.append((K.WARPS, dict(K.STAGES), r.cfg.kernels.prefetch_rows)))
    base = EngineConfig()
    for name in ("nw8", "st3", "nopf", "base"):
        recapture(r, base, name)
    assert seen == [(8, {64: 2}, 1), (4, {}, 1), (4, {64: 2}, 0), (4, {64: 2}, 1)]
    assert (K.WARPS, K.STAGES) == (4, {64: 2})
