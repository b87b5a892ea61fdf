"""What a running server says about itself: /v1/engine and /v1/models, health, idleness
(/metrics), the engine's trace."""
from __future__ import annotations

import contextlib
import time

import httpx


def server_info(url: str) -> dict:
    """GET /v1/engine and /v1/models (either may be missing on foreign servers)."""
    out: dict = {}
    with httpx.Client(timeout=10) as c:
        for path, key in (("/v1/engine", "engine"), ("/v1/models", "models")):
            try:
                r = c.get(url + path)
                out[key] = r.json() if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                out[key] = None
    return out


def model_facts(info: dict) -> tuple[str, int | None, int | None]:
    """(model id, vocab size, max_model_len) from /v1/engine and /v1/models."""
    model, vocab, mml = "default", None, None
    models = (info.get("models") or {}).get("data") or []
    if models:
        model = models[0].get("id", model)
        mml = models[0].get("max_model_len")
        vocab = models[0].get("vocab_size")
    eng = info.get("engine") or {}
    desc = eng.get("engine") or {}
    shape = desc.get("shape") or {}
    vocab = vocab or shape.get("vocab") or shape.get("vocab_size")
    mml = mml or desc.get("max_model_len") or (eng.get("config") or {}).get("max_model_len")
    return model, vocab, mml


def healthy(url: str, timeout: float = 5.0) -> bool:
    """Does the server still serve (GET /health, else /v1/models: 200)?"""
    with httpx.Client(timeout=timeout) as c:
        for path in ("/health", "/v1/models"):
            with contextlib.suppress(httpx.HTTPError):
                if c.get(url + path).status_code == 200:
                    return True
    return False


def wait_idle(url: str, timeout: float = 15.0) -> dict:
    """Wait until a tfengine server runs and queues no stream (GET /metrics); other servers: no wait.
    Returns {"confirmed": bool | None, "waited_s": float}."""
    t0 = time.monotonic()
    while True:
        try:
            r = httpx.get(url + "/metrics", timeout=5)
            text = r.text if r.status_code == 200 else ""
        except httpx.HTTPError:
            text = ""
        vals = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in ("tfengine_running_streams", "tfengine_waiting_streams"):
                vals[parts[0]] = float(parts[1])
        if len(vals) < 2:
            return {"confirmed": None, "waited_s": time.monotonic() - t0}
        if not any(vals.values()):
            return {"confirmed": True, "waited_s": time.monotonic() - t0}
        if time.monotonic() - t0 > timeout:
            return {"confirmed": False, "waited_s": time.monotonic() - t0}
        time.sleep(0.05)


def fetch_trace(url: str) -> list[dict] | None:
    try:
        r = httpx.get(url + "/v1/trace", timeout=30)
        return r.json().get("steps") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
