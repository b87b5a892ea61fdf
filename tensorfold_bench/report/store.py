"""A receipt's data on disk: `STEM.json.xz`, the receipt's JSON written compactly (no indent,
no spaces) and compressed with xz. Receipts written before this form are `STEM.json`, indented
JSON; `load` reads both (by the file's first bytes, not its name), `write` writes only the new.

Why this form. A sweep keeps every token's gap (`gaps_us`, about 500,000 integers at 64
streams), and a long-prompt run every token's time and id and the engine's trace; written
indented, one value a line, a sweep receipt was 7 MB. Measured on the committed receipts (60 MB
of indented JSON): compact JSON 27.9 MB, gzip of it 9.0 MB, xz of it 5.9 MB. Delta-encoding the
integer arrays first gained under 1 % with gzip and lost with xz, because the bulk of them is
already gaps; packing them as binary got gzip to about xz's size but adds an encoding every
reader must know. Compact JSON under xz is therefore the simplest form that fits: one file per
receipt, no transformation of the data, readable with `xzcat FILE | jq` or Python's standard
`lzma`, and generic (any nested dict a scenario or a new field puts in a receipt is stored as it
is, with nothing to register here).

Lossless: JSON writes an int exactly and a float as the shortest text that reads back to the
same float, so `load(write(x)) == x` for any receipt that came from JSON (a NaN would read back
as NaN, which compares unequal to itself; receipts hold none).

The cost is the writer's time: xz at its default preset compresses about 1 MB/s on one core, so
a whole sweep receipt takes a few seconds, paid between runs while no server is running."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

from tensorfold_bench.errors import BenchError

SUFFIX = ".json.xz"  # what `write` writes
OLD_SUFFIX = ".json"  # receipts written before, still read
XZ_MAGIC = b"\xfd7zXZ\x00"


def stem(path: Path) -> str:
    """A receipt file's name without `.json.xz` or `.json`: the name its Markdown and picture share."""
    name = Path(path).name
    for suffix in (SUFFIX, OLD_SUFFIX):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def sibling(path: Path, suffix: str) -> Path:
    """The file beside a receipt's data that shares its stem: sibling(X.json.xz, ".md") is X.md."""
    return Path(path).with_name(stem(path) + suffix)


def encode(data: dict) -> bytes:
    return lzma.compress((json.dumps(data, separators=(",", ":")) + "\n").encode())


def decode(raw: bytes) -> object:
    """The JSON value in a receipt file's bytes, in either form."""
    return json.loads(lzma.decompress(raw) if raw.startswith(XZ_MAGIC) else raw)


def write(data: dict, out_dir: Path, name: str) -> Path:
    """Write `name`.json.xz under out_dir, whole and then renamed, so a reader (or a stop
    mid-write) never sees half of it; return its path."""
    path = Path(out_dir) / f"{name}{SUFFIX}"
    atomic(path, encode(data))
    return path


def atomic(path: Path, raw: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(raw)
    tmp.replace(path)


def load(path: Path) -> dict:
    try:
        data = decode(Path(path).read_bytes())
    except OSError as e:
        raise BenchError(f"{path}: cannot read: {e.strerror}") from None
    except lzma.LZMAError as e:
        raise BenchError(f"{path} is not a tfbench receipt (broken xz data: {e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BenchError(f"{path} is not a tfbench receipt (not JSON: {e})") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("tfbench.receipt/"):
        raise BenchError(f"{path} is not a tfbench receipt (no schema field)")
    return data
