"""Typed field readers for request bodies. Each raises BadRequest naming the field; null always
means "the default" (OpenAI's convention). bool is never accepted for a number, nor a number for
a bool."""
from __future__ import annotations

import math

from engine.server.errors import BadRequest

INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadRequest(f"'{name}' must be in [{lo}, {hi}], not {value}" if hi is not None
                         else f"'{name}' must be at least {lo}, not {value}", name)
    return value


def get_int(body: dict, name: str, default: int | None, lo: int | None = None, hi: int | None = None):
    value = body.get(name)
    return default if value is None else _int(name, value, lo, hi)


def get_float(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{name}' must be a number", name)
    value = float(value)
    if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
        raise BadRequest(f"'{name}' must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], not {value:g}", name)
    return value


def get_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", name)
    return value


def get_enum(body: dict, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise BadRequest(f"'{name}' must be one of {', '.join(map(repr, allowed))}, not {value!r}"[:300], name)
    return value


def get_str(body: dict, name: str, max_len: int = 1024) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or len(value) > max_len):
        raise BadRequest(f"'{name}' must be a string of at most {max_len} characters", name)
    return value


def check_neutral(body: dict, name: str, neutral: tuple) -> None:
    """A field the server accepts only at its no-op value (clients send it by habit)."""
    value = body.get(name)
    if value is None:
        return
    ok = any(type(value) is type(n) and value == n or (isinstance(n, float) and not isinstance(value, bool)
             and isinstance(value, int) and value == n) for n in neutral)
    if not ok:
        shown = " or ".join(repr(n) for n in neutral)
        raise BadRequest(f"'{name}' is not implemented by this server: only {shown} (or null) is accepted", name)


def get_stop(body: dict, limit: int = 16) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if (not isinstance(items, list) or len(items) > limit
            or not all(isinstance(s, str) and s for s in items)):
        raise BadRequest(f"'stop' must be a non-empty string or a list of at most {limit} non-empty strings", "stop")
    return list(items)


def get_token_ids(body: dict, name: str, vocab: int, limit: int = 1024) -> list[int]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        raise BadRequest(f"'{name}' must be a list of at most {limit} token ids", name)
    for t in value:
        _int(name, t, 0, vocab - 1)
    return list(value)
