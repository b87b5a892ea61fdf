"""Bring committed receipts' JSON up to what `tfbench report` renders from (run once per change).

2026-11-30: long-prompt receipts store their statistics (`stats`, computed by
tensorfold_bench.figures from the runs' figures) instead of the renderer computing them. Receipts
made with a verdict margin (`settings.margin`) get `stats` added; older ones had no statistics
section and get none. Nothing else in the JSON changes, so each Markdown renders byte-identical.

    PYTHONPATH=. python scripts/migrate_receipts.py receipts/*.json
"""
import json
import sys
from pathlib import Path

from tensorfold_bench import figures


def migrate(data: dict) -> bool:
    if data.get("scenario") == "long-prompt" and "stats" not in data and "margin" in data["settings"] \
            and len(data["variants"]) > 1 and data["runs"]:
        data["stats"] = figures.long_prompt_stats(data)
        return True
    return False


if __name__ == "__main__":
    for p in map(Path, sys.argv[1:]):
        d = json.loads(p.read_text())
        if migrate(d):
            p.write_text(json.dumps(d, indent=1) + "\n")
            print(f"migrated {p}")
