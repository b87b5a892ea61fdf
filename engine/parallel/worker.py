"""A tensor-parallel worker rank (1..N-1): `python -m engine.parallel.worker`, started by rank 0
(engine/parallel/launch.py). It reads a Start frame and then one plan frame per forward from its stdin,
and runs each plan on its rank runner exactly as rank 0 runs it, so both meet at the same collectives.

It ends itself when rank 0 goes: its stdin closes (EOF), or, should it be blocked inside a
collective at the time, a thread sees its parent change and exits the process.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time

PARENT_POLL_S = 0.5


def _parent_watch(parent: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent:
            os._exit(1)


def serve_plans(runner, stream) -> None:
    """Run every plan frame until the stream ends. A ValueError is the runner's check of its
    inputs, made before any collective on every rank alike: rank 0 reports it, the next plan runs.
    Anything else may have left this rank out of step with the others: it raises, the worker
    exits, and rank 0 ends the server naming this rank."""
    log = logging.getLogger("engine.parallel.worker")
    while True:
        try:
            name, args, kwargs = pickle.load(stream)
        except EOFError:
            return
        try:
            getattr(runner, name)(*args, **kwargs)
        except ValueError as exc:
            log.debug("%s refused here as on rank 0: %s", name, exc)


def main() -> None:
    # Ctrl-C reaches the whole process group: rank 0 handles it and closes this rank's stdin
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    threading.Thread(target=_parent_watch, args=(parent,), name="parent-watch", daemon=True).start()
    stream = sys.stdin.buffer
    try:
        start = pickle.load(stream)
    except EOFError:  # rank 0 went before telling this rank anything
        os._exit(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s rank {start.rank} %(name)s: %(message)s")
    import torch

    from engine.parallel.group import TensorParallel, join, tcp_store
    from engine.models.presets import resolve_model
    from engine.parallel.runner import build_tp_runner

    code = 0
    try:
        if start.cfg.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(start.cfg.device))
        else:
            torch.set_num_threads(start.threads)
        store = tcp_store(start.world, start.port)
        join(start.cfg.device, start.rank, start.world, store)
        vocab = resolve_model(start.cfg.model)[0].vocab_size
        runner = build_tp_runner(start.cfg, TensorParallel(start.rank, start.world, vocab))
        serve_plans(runner, stream)
    except Exception as exc:  # one line; rank 0 ends the server naming this rank
        logging.getLogger("engine.parallel.worker").error("rank %d: %s: %s", start.rank, type(exc).__name__,
                                                    str(exc).splitlines()[0] if str(exc) else "")
        code = 1
    sys.stderr.flush()
    os._exit(code)  # no teardown of the group: rank 0 may be gone, and NCCL's would wait for it


if __name__ == "__main__":
    main()
