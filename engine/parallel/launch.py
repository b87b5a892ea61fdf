"""Rank 0's side of tensor parallel: start the worker ranks, send them each forward's plan, and
end the server when one dies.

Rank 0 is the server process (HTTP, the lane host, runner rank 0). Ranks 1..N-1 are processes
it starts (`python -m engine.parallel.worker`), each with a rank runner on its shard. Before every forward
rank 0 writes the call the lane host made (prefill_step / prefill_many / decode, with its lanes,
tokens, positions, cut and sampling parameters) to each worker's stdin as one pickle frame; every
rank then runs the same forward, meeting at the same collectives. The scheduler never sees any
of this: it talks to a TPBackend as to any backend.

Failure: a thread per worker waits on it; a worker that exits while the server runs ends the
server at once with one line naming the rank and its exit code (rank 0 may be blocked in a
collective that would otherwise wait for the collective timeout, or forever inside a CUDA graph).
A worker ends itself when rank 0 goes (its stdin closes, or its parent changes: engine/parallel/worker.py).
"""
from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace

from engine.config import EngineConfig
from engine.parallel.group import TensorParallel, join, tcp_store
from engine.models.presets import resolve_model

log = logging.getLogger("engine.tp")
EXIT_RANK_DIED = 3
# A worker that fails while the ranks start (a bad checkpoint, the KV cache too large) fails as
# rank 0 does: rank 0 gets this long to say it in its own words before the watcher says it.
START_GRACE_S = 2.0


@dataclass(frozen=True)
class Start:
    """The first frame a worker reads: who it is and where the group meets."""

    cfg: EngineConfig  # with the worker's own device (cuda:r)
    rank: int
    world: int
    port: int
    threads: int


def rank_device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else device


def device_names(device: str, world: int) -> list[str]:
    """Every rank's device, by name (the receipt names the GPUs)."""
    if device.startswith("cuda"):
        import torch
        return [torch.cuda.get_device_name(r) for r in range(world)]
    import platform
    return [platform.processor() or platform.machine() or "cpu"] * world


class Workers:
    """Ranks 1..N-1: started, fed plan frames, watched."""

    def __init__(self, cfg: EngineConfig, port: int, threads: int):
        n = cfg.tensor_parallel
        self.closing = False
        self.started = False  # set once rank 0's runner is built
        self.procs: list[subprocess.Popen] = []
        for r in range(1, n):
            p = subprocess.Popen([sys.executable, "-m", "engine.parallel.worker"], stdin=subprocess.PIPE)
            self.procs.append(p)
            start = Start(replace(cfg, device=rank_device(cfg.device, r)), r, n, port, threads)
            pickle.dump(start, p.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            p.stdin.flush()
            log.info("tensor parallel: rank %d is pid %d", r, p.pid)
        for r, p in enumerate(self.procs, 1):
            threading.Thread(target=self._watch, args=(r, p), name=f"tp-watch-{r}", daemon=True).start()

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if not self.started:
            time.sleep(START_GRACE_S)
        if self.closing:
            return
        line = f"tensor parallel rank {rank} (pid {proc.pid}) exited with code {code}: the server stops"
        log.error(line)
        print(f"error: {line}", file=sys.stderr, flush=True)
        self.kill()
        os._exit(EXIT_RANK_DIED)

    def send(self, plan: tuple) -> None:
        frame = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        for p in self.procs:
            p.stdin.write(frame)
            p.stdin.flush()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def close(self, grace_s: float = 5.0) -> None:
        """Stop the workers: their stdin closes and they exit; what is left after grace_s is killed."""
        self.closing = True
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                p.kill()


class TPBackend:
    """The lane host's backend at N > 1: each call goes to every worker as a plan, then runs here."""

    def __init__(self, runner, workers: Workers, store):
        self.runner, self.workers, self._store = runner, workers, store

    def __getattr__(self, name):
        return getattr(self.runner, name)  # parallel, max_model_len, vocab_size, batch_cuts, describe, ...

    def _both(self, name: str, args: tuple, kwargs: dict):
        # a worker's logprobs go nowhere: it gets a list of its own when rank 0's call has one
        plan_kw = {k: ([] if k == "logprobs" and v is not None else v) for k, v in kwargs.items()}
        self.workers.send((name, args, plan_kw))
        return getattr(self.runner, name)(*args, **kwargs)

    def prefill_step(self, lane, tokens, start, end, sampling=None, logprobs=None):
        return self._both("prefill_step", (lane, list(tokens), start, end),
                          {"sampling": sampling, "logprobs": logprobs})

    def prefill_many(self, items):
        return self._both("prefill_many", ([(lane, list(t), s, e) for lane, t, s, e in items],), {})

    def decode(self, lanes, tokens, positions, sampling=None, logprobs=None):
        return self._both("decode", (list(lanes), list(tokens), list(positions)),
                          {"sampling": None if sampling is None else list(sampling), "logprobs": logprobs})

    def close(self) -> None:
        self.workers.close()


def start_tensor_parallel(cfg: EngineConfig, threads: int) -> TPBackend:
    """Start ranks 1..N-1, join the group as rank 0 and build rank 0's runner."""
    from engine.parallel.runner import build_tp_runner

    n = cfg.tensor_parallel
    mcfg = resolve_model(cfg.model)[0]
    store = tcp_store(n)
    workers = Workers(cfg, store.port, threads)
    try:
        join(rank_device(cfg.device, 0), 0, n, store)
        runner = build_tp_runner(cfg, TensorParallel(0, n, mcfg.vocab_size), device_names(cfg.device, n))
    except BaseException:
        workers.close(grace_s=1.0)
        raise
    workers.started = True
    return TPBackend(runner, workers, store)
