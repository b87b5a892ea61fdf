"""A receipt's data on disk: `STEM.json.gz`, the receipt's JSON written compactly (no indent,
no spaces) and gzip-compressed. Receipts written before this form are `STEM.json`, indented
JSON; `load` reads both (by the file's first bytes, not its name), `write` writes only the new.

Why this form. A sweep keeps every token's gap (`gaps_us`, about 500,000 integers at 64
streams), and a long-prompt run every token's time and id and the engine's trace; written
indented, one value a line, a sweep receipt was 7 MB. Measured on the committed receipts (60 MB
of indented JSON): compact JSON 27.9 MB, gzip of it 9.0 MB, xz of it 5.9 MB. Delta-encoding the
integer arrays first gained about 1 % under gzip (and lost under xz), because the bulk of them
is already gaps; packing them as binary integers inside the JSON came out larger under gzip,
and adds an encoding every reader must know. xz is a third smaller than gzip but decompresses
about ten times slower, which made reading every committed receipt (what the receipts test
does on each run) slower than parsing the old indented files; gzip reads as fast as they did.
So: compact JSON under gzip, one file per receipt, no transformation of the data, readable with
`zcat FILE | jq` or Python's standard `gzip`, and generic (any nested dict a scenario or a new
field puts in a receipt is stored as it is, with nothing to register here).

Lossless: JSON writes an int exactly and a float as the shortest text that reads back to the
same float, so `load(write(x)) == x` for any receipt that came from JSON (a NaN would read back
as NaN, which compares unequal to itself; receipts hold none). The gzip header carries no time
stamp, so the same receipt always gives the same bytes."""
from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from tensorfold_bench.errors import BenchError

SUFFIX = ".json.gz"  # what `write` writes
OLD_SUFFIX = ".json"  # receipts written before, still read
GZIP_MAGIC = b"\x1f\x8b"


def stem(path: Path) -> str:
    """A receipt file's name without `.json.gz` or `.json`: the name its Markdown and picture share."""
    name = Path(path).name
    for suffix in (SUFFIX, OLD_SUFFIX):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def sibling(path: Path, suffix: str) -> Path:
    """The file beside a receipt's data that shares its stem: sibling(X.json.gz, ".md") is X.md."""
    return Path(path).with_name(stem(path) + suffix)


def encode(data: dict) -> bytes:
    return gzip.compress((json.dumps(data, separators=(",", ":")) + "\n").encode(), 9, mtime=0)


def decode(raw: bytes) -> object:
    """The JSON value in a receipt file's bytes, in either form."""
    return json.loads(gzip.decompress(raw) if raw.startswith(GZIP_MAGIC) else raw)


def write(data: dict, out_dir: Path, name: str) -> Path:
    """Write `name`.json.gz under out_dir, whole and then renamed, so a reader (or a stop
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
        raw = Path(path).read_bytes()
    except OSError as e:
        raise BenchError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = decode(raw)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise BenchError(f"{path} is not a tfbench receipt (broken gzip data: {e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BenchError(f"{path} is not a tfbench receipt (not JSON: {e})") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("tfbench.receipt/"):
        raise BenchError(f"{path} is not a tfbench receipt (no schema field)")
    return data
