"""Bring committed receipts up to what `tfbench report` renders from and to the form the writer
writes (run once per change; a receipt already up to date is left as it is).

2026-11-30: long-prompt receipts store their statistics (`stats`, computed by
tensorfold_bench.figures from the runs' figures) instead of the renderer computing them. Receipts
made with a verdict margin (`settings.margin`) get `stats` added; older ones had no statistics
section and get none. Nothing else in the JSON changes, so each Markdown renders byte-identical.

2026-12-01: receipts' data is stored as STEM.json.gz (compact JSON under gzip, see
tensorfold_bench/report/store.py) instead of indented STEM.json. Each STEM.json is rewritten in
the new form, read back and compared with what the old file held (equal, or the script stops
before deleting anything), and then deleted. The Markdown and picture beside it stay as they are.

2026-12-02: the writer stores sweep gaps across streams and records' token times as nanosecond
deltas (store.pack). A STEM.json.gz whose bytes are not what the writer now writes is rewritten
the same way: read back, compared equal, and only then put in place of the old file.

    PYTHONPATH=. python scripts/migrate_receipts.py receipts/*.json receipts/*.json.gz
"""
import copy
import sys
from pathlib import Path

from tensorfold_bench import figures
from tensorfold_bench.report import store


def migrate(data: dict) -> bool:
    if data.get("scenario") == "long-prompt" and "stats" not in data and "margin" in data["settings"] \
            and len(data["variants"]) > 1 and data["runs"]:
        data["stats"] = figures.long_prompt_stats(data)
        return True
    return False


def convert(path: Path) -> str:
    """One receipt file, old form or new: `stats` added where it lacks them, written as
    STEM.json.gz, the old file deleted once the new one reads back equal to what it held."""
    old = store.load(path)
    data = copy.deepcopy(old)
    changed = migrate(data)
    if path.name.endswith(store.SUFFIX) and not changed and path.read_bytes() == store.encode(data):
        return f"{path}: up to date"
    new = Path(path).with_name(store.stem(path) + store.SUFFIX)
    raw = store.encode(data)
    if store.decode(raw) != data:  # without stats added, data is what the old file held
        raise SystemExit(f"{path}: the new form does not read back equal; {path} kept")
    store.atomic(new, raw)
    if new != path:
        path.unlink()
    return f"{path} -> {new.name}" + (" (stats added)" if changed else "")


if __name__ == "__main__":
    for p in map(Path, sys.argv[1:]):
        print(convert(p))
