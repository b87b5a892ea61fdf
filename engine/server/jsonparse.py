"""Parse a request body into plain JSON values and check its shape before anything reads it:
no NaN/Infinity, no lone surrogates, nesting at most MAX_DEPTH deep, at most `max_values` values.
Pure functions without aiohttp, so a worker process can run them on large bodies."""
from __future__ import annotations

import json
import re

MAX_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_checked(data: bytes | str, max_values: int) -> tuple[str, object]:
    """("ok", value) or ("bad", message). Never raises on bad input."""
    try:
        value = json.loads(data, parse_constant=_no_constants)
    except RecursionError:
        return "bad", f"the request body is nested too deeply (at most {MAX_DEPTH} levels)"
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        return "bad", f"the request body is not valid JSON: {exc}"
    problem = check_tree(value, max_values)
    return ("bad", problem) if problem else ("ok", value)


def check_tree(value: object, max_values: int) -> str | None:
    """The first problem found in a parsed body, or None. Iterative: depth cannot recurse."""
    stack: list[tuple[object, int, str, object]] = [(value, 0, "", None)]
    count = 1
    while stack:
        node, depth, parent, key = stack.pop()
        if depth > MAX_DEPTH:
            return f"the request body is nested too deeply (at most {MAX_DEPTH} levels)"
        if isinstance(node, str):
            bad = _SURROGATE.search(node)
            if bad:
                return f"{_path(parent, key) or 'the body'} holds a lone surrogate (U+{ord(bad.group()):04X}): send valid Unicode"
        elif isinstance(node, (dict, list)):
            count += len(node)
            if count > max_values:
                return f"the request body holds more than {max_values} JSON values"
            here = _path(parent, key)
            if isinstance(node, dict):
                for k, item in node.items():
                    if _SURROGATE.search(k):
                        return f"a key in {here or 'the body'} holds a lone surrogate: send valid Unicode"
                    stack.append((item, depth + 1, here, k))
            else:
                stack.extend((item, depth + 1, here, i) for i, item in enumerate(node)
                             if isinstance(item, (str, dict, list)))
    return None


def _path(parent: str, key: object) -> str:
    """'prompt', 'messages[0].content': where a value sits, for error messages."""
    if key is None:
        return parent
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else f"'{key}'"
