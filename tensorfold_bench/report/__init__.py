"""Receipts: the JSON behind a session (everything), and the Markdown a reviewer pastes into a
pull request, rendered from the JSON alone (`tfbench report FILE.json` re-renders it). Renders
figures and statistics that tensorfold_bench.figures computed; imports no scenario."""
from __future__ import annotations

import json
from pathlib import Path

from tensorfold_bench.errors import BenchError
from tensorfold_bench.report import compare, gate, long_prompt, pictures, sweep

__all__ = ["compare", "load", "render_markdown", "render_png", "rerender", "write"]

MARKDOWN = {"long-prompt": long_prompt.markdown, "sweep": sweep.markdown, "gate": gate.markdown}
PICTURE = {"long-prompt": pictures.timeline, "sweep": pictures.sweep}  # a gate receipt has none


def render_markdown(data: dict, png_name: str | None = None) -> str:
    return MARKDOWN[data.get("scenario", "long-prompt")](data, png_name)


def render_png(data: dict, path: Path) -> Path | None:
    draw = PICTURE.get(data.get("scenario", "long-prompt"))
    return draw(data, path) if draw else None


def write(data: dict, out_dir: Path, stem: str) -> dict[str, Path]:
    """Write STEM.json, STEM.md and (but for a gate) STEM.png under out_dir; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    png = render_png(data, paths["png"])
    if png is None:
        del paths["png"]
    paths["md"].write_text(render_markdown(data, png.name if png else None))
    return paths


def load(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not str(data.get("schema", "")).startswith("tfbench.receipt/"):
        raise BenchError(f"{path} is not a tfbench receipt (no schema field)")
    return data


def rerender(path: Path, png: bool = True) -> str:
    """`tfbench report`: the Markdown again from the JSON (and the picture, unless png=False;
    an existing picture beside the JSON is still linked), written beside it and returned."""
    data = load(path)
    png_path = render_png(data, path.with_suffix(".png")) if png else path.with_suffix(".png")
    png_path = png_path if png_path is not None and png_path.exists() else None
    md = render_markdown(data, png_path.name if png_path else None)
    path.with_suffix(".md").write_text(md)
    return md
