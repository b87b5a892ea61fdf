"""A receipt's data on disk: `STEM.json.gz`, the receipt's JSON written compactly (no indent,
no spaces) and gzip-compressed. Receipts written before this form are `STEM.json`, indented
JSON; `read` reads both (by the file's first bytes, not its name), `write` writes only the new.

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

Two per-token fields are written in a form that compresses better, and read back exactly
(`pack` on write, `unpack` on load; the dict in memory never sees the disk form):

- A sweep batch's `gaps_us` (per stream: microseconds from its send to its first token, then
  between tokens) is written as `gaps_us_across`: each stream's arrival times on the batch's
  clock (its send's offset from the batch's first send, from `sent`, plus its gaps) minus the
  previous stream's at the same token index; past the previous stream's length, its own gaps.
  Streams of one batch get their k-th token from the same decode round, so these are tens of
  microseconds where the gaps are thousands. Measured on the committed sweeps (gzip'ed bytes
  of all batches' gap lists, the H200 64-stream sweep `20261201-230639` and the 2-core CPU
  sweep `20261130-125427`): as gaps 916 / 1,030 kB; second differences within a stream 864 /
  1,033; across streams on each stream's own send clock 576 / 832; across streams on the
  batch's clock (this form) 546 / 733. xz of the plain gaps: 591 / 776, read ten times slower.
  Every committed receipt together: 10.0 MB before, 7.3 MB in these forms.
- A record's `token_times` (seconds, to the nanosecond) is written as `token_times_ns`: the
  first time in integer nanoseconds, then nanosecond deltas (about 30 % smaller under gzip), used
  only where every time reads back as the same float (n / 1e9 is the float nearest n ns, which
  is what the 9-decimal text parsed to; checked per list, else the list is written as it is).

Lossless: JSON writes an int exactly and a float as the shortest text that reads back to the
same float, and both forms above are integer arithmetic, so `read(write(x)) == x` for any
receipt that came from JSON (a NaN would read back as NaN, which compares unequal to itself;
receipts hold none). Receipts written before either form still load: a `gaps_us` or
`token_times` on disk is read as it is. The gzip header carries no time stamp, so the same
receipt always gives the same bytes."""
from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from tensorfold_bench import SCHEMA
from tensorfold_bench.analysis import figures
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


def plain(o: object) -> object:
    """The receipt's data as JSON values. The session keeps each stream's and request's record as
    its object until here: an object is written as its `to_dict()`."""
    if isinstance(o, dict):
        return {k: plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [plain(v) for v in o]
    to_dict = getattr(o, "to_dict", None)
    return plain(to_dict()) if callable(to_dict) else o


def encode(data: dict) -> bytes:
    return gzip.compress((json.dumps(pack(plain(data)), separators=(",", ":")) + "\n").encode(), 9, mtime=0)


def decode(raw: bytes) -> object:
    """The JSON value in a receipt file's bytes, in either form."""
    return unpack(json.loads(gzip.decompress(raw) if raw.startswith(GZIP_MAGIC) else raw))


# ---- the per-token fields' disk forms ------------------------------------------------------

GAPS, ACROSS = "gaps_us", "gaps_us_across"
TIMES, TIMES_NS = "token_times", "token_times_ns"


def offsets_us(sent: object, n: int) -> list[int]:
    """Each stream's send on the batch's clock, in whole microseconds after the first send (both
    directions compute it from the same stored floats, so any rounding cancels)."""
    if not isinstance(sent, list) or len(sent) != n or not all(isinstance(t, float) for t in sent):
        return [0] * n
    return [round((t - sent[0]) * 1e6) for t in sent]


def gaps_across(gaps: list[list[int]], offs: list[int]) -> list[list[int]]:
    out, prev = [], []
    for row, off in zip(gaps, offs):
        arrive, t = [], off
        for g in row:
            t += g
            arrive.append(t)
        n = min(len(prev), len(row))
        out.append([a - p for a, p in zip(arrive[:n], prev)] + row[n:])
        prev = arrive
    return out


def gaps_back(rows: list[list[int]], offs: list[int]) -> list[list[int]]:
    out, prev = [], []
    for row, off in zip(rows, offs):
        n, arrive = min(len(prev), len(row)), []
        for k, d in enumerate(row):
            arrive.append(prev[k] + d if k < n else (arrive[-1] if arrive else off) + d)
        out.append([b - a for a, b in zip([off] + arrive, arrive)])
        prev = arrive
    return out


def int_rows(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(r, list) and all(type(x) is int for x in r) for r in v)


def times_ns(times: list) -> list[int] | None:
    """`times` as the first nanosecond and the deltas after it, or None where a time would not
    read back as the same float."""
    if not times or not all(type(t) is float for t in times):
        return None
    ns = [round(t * 1e9) for t in times]
    if any(n / 1e9 != t for n, t in zip(ns, times)):
        return None
    return ns[:1] + [b - a for a, b in zip(ns, ns[1:])]


def times_back(deltas: list[int]) -> list[float]:
    out, n = [], 0
    for d in deltas:
        n += d
        out.append(n / 1e9)
    return out


def swap(d: dict, old: str, new: str, value: object) -> dict:
    """`d` with key `old` renamed `new` (holding `value`) in its place, the other keys in order."""
    return {(new if k == old else k): (value if k == old else v) for k, v in d.items()}


def pack(o: object) -> object:
    """The receipt's disk form: every dict's `gaps_us` and `token_times` in their compact forms."""
    if isinstance(o, dict):
        o = {k: pack(v) if isinstance(v, (dict, list)) and k not in (GAPS, TIMES) else v for k, v in o.items()}
        if GAPS in o and int_rows(o[GAPS]):
            o = swap(o, GAPS, ACROSS, gaps_across(o[GAPS], offsets_us(o.get("sent"), len(o[GAPS]))))
        if TIMES in o and isinstance(o[TIMES], list) and (ns := times_ns(o[TIMES])) is not None:
            o = swap(o, TIMES, TIMES_NS, ns)
        return o
    if isinstance(o, list) and o and isinstance(o[0], (dict, list)):
        return [pack(x) for x in o]
    return o


def unpack(o: object) -> object:
    """pack's inverse: what the receipt held in memory."""
    if isinstance(o, dict):
        o = {k: unpack(v) if isinstance(v, (dict, list)) and k not in (ACROSS, TIMES_NS) else v for k, v in o.items()}
        if ACROSS in o:
            o = swap(o, ACROSS, GAPS, gaps_back(o[ACROSS], offsets_us(o.get("sent"), len(o[ACROSS]))))
        if TIMES_NS in o:
            o = swap(o, TIMES_NS, TIMES, times_back(o[TIMES_NS]))
        return o
    if isinstance(o, list) and o and isinstance(o[0], (dict, list)):
        return [unpack(x) for x in o]
    return o


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


def read(path: Path) -> dict:
    """A receipt's data from either form on disk, migrated to SCHEMA (`migrate`)."""
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
    return migrate(data, path)


# ---- every older form, brought to SCHEMA on read ---------------------------------------------

def long_prompt_stats(data: dict) -> dict:
    """Version 1 -> 2: a long-prompt receipt with verdicts (two variants or more, runs, launched
    servers) stores its statistics; one of version 1 may lack them, and gets them computed from
    its runs' figures as the renderer computes them from any receipt's."""
    st = data.get("settings") or {}
    if (data.get("scenario") == "long-prompt" and "stats" not in data and "margin" in st and not st.get("url")
            and len(data.get("variants") or []) > 1 and data.get("runs")):
        data["stats"] = figures.long_prompt_stats(data)
    return data


# version -> the step to the next. 2 -> 3 (STEM.json.gz) and 3 -> 4 (token times and gaps packed)
# changed only the form on disk, which `decode` and `unpack` recognise by its bytes in any version.
MIGRATIONS = {1: long_prompt_stats, 2: lambda data: data, 3: lambda data: data}


def version(data: dict) -> int:
    return int(str(data["schema"]).rpartition("/")[2] or 0)


def migrate(data: dict, path: Path | str = "<receipt>") -> dict:
    """The receipt's data at SCHEMA, from any older version; a newer one is refused."""
    try:
        v = version(data)
    except ValueError:
        raise BenchError(f"{path}: unknown receipt schema {data['schema']!r}") from None
    if v > version({"schema": SCHEMA}):
        raise BenchError(f"{path}: receipt schema {data['schema']} is newer than this tfbench reads ({SCHEMA})")
    while v in MIGRATIONS:
        data = MIGRATIONS[v](data)
        v += 1
    data["schema"] = SCHEMA
    return data
