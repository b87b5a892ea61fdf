"""engine/cuda_attrs.py: the split attention's shared-memory carveout is asked of the driver once per
value for a compiled kernel, and a failed call is an error naming the attribute (a driver stand-in
here: CI has no GPU; the device runs the real one in engine/dev/PERF.md run 80)."""
import pytest

from engine import cuda_attrs


class Driver:
    def __init__(self, rc=0):
        self.calls, self.rc = [], rc

    def cuFuncSetAttribute(self, fn, attribute, value):
        self.calls.append((fn.value, attribute.value, value.value))
        return self.rc


class Kernel:
    def __init__(self, function):
        self.function = function


def test_a_carveout_is_set_once_per_value_and_the_default_costs_no_call():
    d, k = Driver(), Kernel(0x1234)
    cuda_attrs.carveout(k, cuda_attrs.DEFAULT, d)  # the driver's own choice: nothing to ask
    assert d.calls == []
    cuda_attrs.carveout(k, 100, d)
    cuda_attrs.carveout(k, 100, d)
    assert d.calls == [(0x1234, cuda_attrs.CARVEOUT_ATTRIBUTE, 100)]
    cuda_attrs.carveout(k, cuda_attrs.DEFAULT, d)  # undone: back to the driver's choice
    assert d.calls[-1] == (0x1234, cuda_attrs.CARVEOUT_ATTRIBUTE, -1)


def test_a_refused_carveout_is_an_error():
    with pytest.raises(RuntimeError, match="carveout 100.*CUresult 1"):
        cuda_attrs.carveout(Kernel(0x99), 100, Driver(rc=1))
