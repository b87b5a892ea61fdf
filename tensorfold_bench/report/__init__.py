"""Receipts: the JSON behind a session (everything; on disk as STEM.json.gz, see
tensorfold_bench.report.store), and the Markdown a reviewer pastes into a pull request, rendered
from the JSON alone (`tfbench report STEM.json.gz` re-renders it). Renders figures and
statistics that tensorfold_bench.analysis.figures computed; imports no scenario."""
from __future__ import annotations

from pathlib import Path

from tensorfold_bench.analysis import figures
from tensorfold_bench.receipt import Partial, Receipt, as_receipt
from tensorfold_bench.report import compare, gate, load, long_prompt, pictures, script, store, sweep
from tensorfold_bench.report.store import read, sibling

__all__ = ["compare", "load", "read", "more_pngs", "render_markdown", "render_png", "rerender", "sibling",
           "store", "write"]

MARKDOWN = {"long-prompt": long_prompt.markdown, "sweep": sweep.markdown, "gate": gate.markdown,
            "script": script.markdown, "load": load.markdown}
PICTURE = {"long-prompt": pictures.timeline, "sweep": pictures.sweep, "script": pictures.script,
           "load": pictures.load}  # a gate receipt has none
# drawn beside STEM.png as STEM-NAME.png, and linked by the Markdown's NAME_png argument
MORE_PICTURES = {"long-prompt": {"frontier": pictures.frontier}}
# a scenario's summary of its receipt, which its Markdown and pictures read (`summary=`): the
# session hands the one it computed at the checkpoint; a re-render computes it once here
SUMMARY = {"long-prompt": figures.long_prompt_summary}


def partial_banner(partial: Partial) -> str:
    """What a partial receipt lacks, said first: it was stopped (or is still running)."""
    miss = ", ".join(partial.missing or []) or "nothing"
    return (f"**Partial receipt ({partial.why or 'in progress'}).** {partial.done} of {partial.total} "
            f"runs finished; missing: {miss}. Medians, verdicts and checks below use the finished runs only.")


def scenario(r: Receipt) -> str:
    return r.scenario or "long-prompt"  # receipts from before scenarios name none


def summary_of(r: Receipt) -> object:
    """The scenario's summary of the receipt (SUMMARY's); None for a scenario without one."""
    of = SUMMARY.get(scenario(r))
    return of(r) if of else None


def given(summary: object) -> dict:
    """The renderers' `summary=` argument, where there is a summary to hand them."""
    return {} if summary is None else {"summary": summary}


def render_markdown(data: Receipt | dict, png_name: str | None = None, more_png: dict[str, str] | None = None,
                    summary: object = None) -> str:
    """The Markdown; `more_png`: the further pictures beside it (name -> file name, see more_pngs);
    `summary`: summary_of's, where the caller has it already."""
    r = as_receipt(data)
    more = {f"{k}_png": v for k, v in (more_png or {}).items()}
    md = MARKDOWN[scenario(r)](r, png_name, **more, **given(summary))
    if not r.partial:
        return md
    title, sep, rest = md.partition("\n")
    if not title.startswith("#"):
        title, sep, rest = "", "", md
    return f"{title}{sep}\n{partial_banner(r.partial)}\n\n{rest.lstrip(chr(10))}"


def render_png(data: Receipt | dict, path: Path) -> Path | None:
    r = as_receipt(data)
    draw = PICTURE.get(scenario(r))
    return draw(r, path) if draw else None


def more_pngs(data: Receipt | dict, png: Path, draw: bool, summary: object = None) -> dict[str, str]:
    """The scenario's further pictures beside `png` (STEM-NAME.png for STEM.png), name -> file
    name: those drawn when `draw` (one with nothing to draw is not), else those already there."""
    r, out = as_receipt(data), {}
    for name, draw_one in MORE_PICTURES.get(scenario(r), {}).items():
        path = png.with_name(f"{png.stem}-{name}.png")
        got = draw_one(r, path, **given(summary)) if draw else (path if path.exists() else None)
        if got is not None:
            out[name] = got.name
    return out


def write(data: dict, out_dir: Path, stem: str, png: bool = True, summary: object = None) -> dict[str, Path]:
    """Write STEM.json.gz (the data), STEM.md and (but for a gate, or with png=False) STEM.png
    and the scenario's further pictures (STEM-frontier.png) under out_dir; return their paths.
    Each file is written whole and then renamed, so a reader (or a stop mid-write) never sees
    half a receipt, and the data last, so once STEM.json.gz is there its Markdown and pictures are
    too. `summary`: the session's summary of this receipt (summary_of's), else computed once here
    for the Markdown and the pictures."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}{store.SUFFIX}", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    r = Receipt.from_dict(data)
    summary = summary_of(r) if summary is None else summary
    more = more_pngs(r, paths["png"], draw=True, summary=summary) if png else {}
    png = render_png(r, paths["png"]) if png else None
    if png is None:
        del paths["png"]
    paths.update({f"png-{k}": out_dir / v for k, v in more.items()})
    store.atomic(paths["md"], render_markdown(r, png.name if png else None, more, summary).encode())
    paths["json"] = store.write(data, out_dir, stem)
    return paths


def rerender(path: Path, png: bool = True) -> str:
    """`tfbench report`: the Markdown again from the receipt's data, new form or old (and the
    pictures, unless png=False; an existing picture beside it is still linked), written beside
    it and returned."""
    r = Receipt.from_dict(read(path))
    summary = summary_of(r)
    png_path = render_png(r, sibling(path, ".png")) if png else sibling(path, ".png")
    png_path = png_path if png_path is not None and png_path.exists() else None
    md = render_markdown(r, png_path.name if png_path else None, more_pngs(r, sibling(path, ".png"), png, summary),
                         summary)
    sibling(path, ".md").write_text(md)
    return md
