"""Prometheus text for `/metrics`, read off the lane host's counters and queues."""
from __future__ import annotations

from engine.scheduler.host import LaneHost


def render_metrics(host: LaneHost) -> str:
    c = host.counters
    rows = [
        ("running_streams", "gauge", "streams in a lane (prompt or decode)", host.running),
        ("waiting_streams", "gauge", "requests queued for a lane", len(host.waiting)),
        ("paused_streams", "gauge", "decoding streams whose client has not drained its queue", host.paused),
        ("free_lanes", "gauge", "lanes with no stream", len(host.free)),
        ("prefill_debt_seconds", "gauge", "decode time owed before the next long prompt step", host.debt),
        ("prefill_share", "gauge", "share of wall time for prompt steps while streams decode", host.share),
        ("prompt_steps_total", "counter", "prompt cuts run", c.prompt_steps),
        ("decode_rounds_total", "counter", "batched decode rounds run", c.decode_rounds),
        ("tokens_out_total", "counter", "tokens emitted", c.tokens_out),
        ("drafted_tokens_total", "counter", "draft tokens checked in decode rounds", c.drafted),
        ("accepted_drafts_total", "counter", "draft tokens the target agreed with", c.accepted),
        ("requests_total", "counter", "requests accepted", c.requests),
        ("finished_streams_total", "counter", "streams that ended normally", c.finished),
        ("cancelled_streams_total", "counter", "streams cancelled by their client", c.cancelled),
        ("failed_streams_total", "counter", "streams ended by a backend failure", c.failed),
    ]
    out = []
    for name, kind, help_, value in rows:
        out += [f"# HELP tfengine_{name} {help_}", f"# TYPE tfengine_{name} {kind}", f"tfengine_{name} {value}"]
    return "\n".join(out) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """The inverse, for tests and the harness: {name: value} of the unlabelled samples."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
