"""Two disjoint SM partitions of one GPU, each with a stream: the decode rounds' and the prompt
cuts' (`--prefill-mode split`).

A decode round is bound by the memory and streams the weights near the copy rate from a third of
the SMs; a long prompt's cut is bound by the tensor cores. Launched on two plain streams the device
runs them one after the other, since each kernel asks for every SM; on disjoint SMs (CUDA green
contexts) they run side by side. One split of the device's SM resource gives both partitions
(`cuDevSmResourceSplitByCount`: n SMs and the remainder), so they never share an SM; contexts made
one at a time from the whole device may.

A kernel runs in the context it was launched into, and a graph's kernels in the context of the
stream they were captured on: a graph captured on the whole device and replayed into a green
context's stream still spreads over every SM. The decode partition's rounds are therefore
captured on its stream (engine/runner/decode_graph.py, `DecodeGraphs(stream=...)`).

Needs the CUDA driver's green contexts (12.4 or later) through the `cuda-bindings` package.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Hopper partitions SMs in groups of 8 (the driver's granularity on compute capability 9.0+)
SM_GROUP = 8


@dataclass
class SmSplit:
    decode: torch.cuda.ExternalStream  # the decode partition's stream
    prompt: torch.cuda.ExternalStream  # the prompt partition's stream
    decode_sms: int
    prompt_sms: int
    _keep: list = field(default_factory=list, repr=False)  # the driver's contexts and streams


def check_decode_sms(n: int, total: int) -> str | None:
    """Why `--decode-sms n` cannot split a device of `total` SMs (None: it can)."""
    if n % SM_GROUP or not SM_GROUP <= n <= total - SM_GROUP:
        return (f"--decode-sms must be a multiple of {SM_GROUP} from {SM_GROUP} to {total - SM_GROUP} "
                f"(this device has {total} SMs), not {n}")
    return None


def ok(res):
    """cuda.bindings answers (CUresult, *values): the values, or an error naming the result."""
    err, *vals = res
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver: {err!r}")
    return None if not vals else vals[0] if len(vals) == 1 else tuple(vals)


def driver():
    try:
        from cuda.bindings import driver as d
    except ImportError as e:
        raise RuntimeError("--prefill-mode split needs the cuda-bindings package (pip install cuda-bindings)") from e
    return d


def device_sms(device_index: int):
    """(the driver module, the device, its whole SM resource)."""
    d = driver()
    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(device_index))
    return d, dev, ok(d.cuDeviceGetDevResource(dev, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))


def green_stream(d, dev, resource, device_index: int, keep: list) -> torch.cuda.ExternalStream:
    """A green context over `resource` (SMs) and a non-blocking stream of it; both kept in `keep`."""
    desc = ok(d.cuDevResourceGenerateDesc([resource], 1))
    ctx = ok(d.cuGreenCtxCreate(desc, dev, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    s = ok(d.cuGreenCtxStreamCreate(ctx, d.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    keep += [ctx, s]
    return torch.cuda.ExternalStream(int(s), device=torch.device("cuda", device_index))


def split_sms(decode_sms: int, device_index: int) -> SmSplit:
    """n SMs for decode rounds and the rest for prompt cuts, disjoint, a non-blocking stream each."""
    why = check_decode_sms(decode_sms, torch.cuda.get_device_properties(device_index).multi_processor_count)
    if why:
        raise ValueError(why)
    d, dev, whole = device_sms(device_index)
    groups, _, rest = ok(d.cuDevSmResourceSplitByCount(1, whole, 0, decode_sms))
    keep: list = []
    decode, prompt = (green_stream(d, dev, r, device_index, keep) for r in (groups[0], rest))
    return SmSplit(decode, prompt, groups[0].sm.smCount, rest.sm.smCount, keep)
