"""Receipts: the JSON behind a session (everything), and the Markdown a reviewer pastes into a
pull request, rendered from the JSON alone (`tfbench report FILE.json` re-renders it). Renders
figures and statistics that tensorfold_bench.figures computed; imports no scenario."""
from __future__ import annotations

import json
from pathlib import Path

from tensorfold_bench.errors import BenchError
from tensorfold_bench.report import compare, gate, long_prompt, pictures, script, sweep

__all__ = ["compare", "load", "render_markdown", "render_png", "rerender", "write"]

MARKDOWN = {"long-prompt": long_prompt.markdown, "sweep": sweep.markdown, "gate": gate.markdown,
            "script": script.markdown}
PICTURE = {"long-prompt": pictures.timeline, "sweep": pictures.sweep, "script": pictures.script}  # a gate receipt has none


def partial_banner(partial: dict) -> str:
    """What a partial receipt lacks, said first: it was stopped (or is still running)."""
    miss = ", ".join(partial.get("missing") or []) or "nothing"
    return (f"**Partial receipt ({partial.get('why', 'in progress')}).** {partial['done']} of {partial['total']} "
            f"runs finished; missing: {miss}. Medians, verdicts and checks below use the finished runs only.")


def render_markdown(data: dict, png_name: str | None = None) -> str:
    md = MARKDOWN[data.get("scenario", "long-prompt")](data, png_name)
    if not data.get("partial"):
        return md
    title, sep, rest = md.partition("\n")
    if not title.startswith("#"):
        title, sep, rest = "", "", md
    return f"{title}{sep}\n{partial_banner(data['partial'])}\n\n{rest.lstrip(chr(10))}"


def render_png(data: dict, path: Path) -> Path | None:
    draw = PICTURE.get(data.get("scenario", "long-prompt"))
    return draw(data, path) if draw else None


def write(data: dict, out_dir: Path, stem: str, png: bool = True) -> dict[str, Path]:
    """Write STEM.json, STEM.md and (but for a gate, or with png=False) STEM.png under out_dir;
    return their paths. Each file is written whole and then renamed, so a reader (or a stop
    mid-write) never sees half a receipt."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    _atomic(paths["json"], json.dumps(data, indent=1) + "\n")
    png = render_png(data, paths["png"]) if png else None
    if png is None:
        del paths["png"]
    _atomic(paths["md"], render_markdown(data, png.name if png else None))
    return paths


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise BenchError(f"{path}: cannot read: {e.strerror}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BenchError(f"{path} is not a tfbench receipt (not JSON: {e})") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("tfbench.receipt/"):
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
