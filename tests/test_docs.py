"""The documentation stays true to the repository: the README stays short, every relative link and
every repository path or module the README and docs/ name exists, every docs page is reachable from
the README, and every `tfbench` command and flag (read from the CLI itself) and every `tfengine
serve` flag is documented."""
import importlib.util
import re
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("engine/", "tensorfold_bench/", "tools/", "scripts/", "receipts/", "docs/", "tests/", "examples/", ".ci/")
# Paths the docs name that a user or a command makes, never committed (git-ignored or created on demand).
MADE = ("runs/", ".worktrees/", ".venvs/", ".ci/accept-new-outputs")


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def prose(page: Path) -> str:
    """The page without its fenced code blocks (which hold commands and trees, not references)."""
    return re.sub(r"^```.*?^```", "", text(page), flags=re.M | re.S)


def links(page: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text(page)) if not re.match(r"[a-z]+:|#", t)]


def code_spans(page: Path) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(page))


def repo_paths(page: Path) -> set[str]:
    """Each path-like word inside an inline code span that starts at a top-level folder; words with
    placeholders (<time>, {md,json}, *, $VAR, NAME) are patterns, not paths."""
    out = set()
    for span in code_spans(page):
        for word in span.split():
            word = word.strip(".,;:()'\"")
            if word.startswith(TOP) and not re.search(r"[<>{}*$]|[A-Z]{3,}", word):
                out.add(word.split("#")[0].split(":")[0])
    return out


def module_names(page: Path) -> set[str]:
    out = set()
    for span in code_spans(page):
        for m in re.finditer(r"(?<![\w/.])((?:engine|tensorfold_bench|tools)(?:\.\w+)+)", span):
            if not re.search(r"\.[A-Z]+(\.|$)", m.group(1)):
                out.add(m.group(1))
    return out


def module_exists(dotted: str) -> bool:
    """The longest dotted prefix that is a module of this repository; the rest may be attributes,
    but the first component after the package must be a module or package."""
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or base.is_dir():
            return True
    return False


def test_the_readme_is_at_most_250_lines():
    n = len(text(ROOT / "README.md").splitlines())
    assert n <= 250, f"README.md has {n} lines; move reference material into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_exists(page):
    missing = [t for t in links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(page):
    named = repo_paths(page)
    missing = sorted(p for p in named if not p.startswith(MADE) and not (ROOT / p).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_named_exists(page):
    missing = sorted(m for m in module_names(page) if not module_exists(m))
    assert not missing, f"{page.name} names modules that do not exist: {missing}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(ROOT / "README.md")}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


def commands(app: typer.Typer) -> dict[str, list[str]]:
    """{'tfbench run long-prompt': ['--model', ...], ...}: every leaf command and its long options."""
    out = {}

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*path, name])
            return
        out[" ".join(path)] = [o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]

    walk(typer.main.get_command(app), [])
    return out


def test_every_tfbench_command_and_flag_is_documented():
    from tensorfold_bench.cli.commands import app
    docs = text(ROOT / "docs" / "harness.md") + text(ROOT / "README.md")
    cmds = commands(app)
    assert {"run long-prompt", "sweep", "gate", "report", "compare"} <= set(cmds)
    missing = [f"tfbench {c}" for c in cmds if f"tfbench {c}" not in docs]
    missing += [f"tfbench {c} {flag}" for c, flags in cmds.items() for flag in flags
                if not re.search(re.escape(flag) + r"(?![\w-])", docs)]
    assert not missing, f"undocumented in docs/harness.md or README.md: {missing}"


def test_every_tfengine_serve_flag_is_documented():
    from engine.cli import app
    doc = text(ROOT / "docs" / "engine.md")
    cmds = commands(app)
    flags = cmds.get("serve") or next(iter(cmds.values()))
    missing = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", doc)]
    assert not missing, f"tfengine serve flags missing from docs/engine.md: {missing}"


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The extractors find a broken link, a missing path and a missing module, so the tests above
    would fail on them (not pass on an empty match)."""
    page = tmp_path / "page.md"
    page.write_text("See [x](nowhere.md) and `engine/nowhere.py` and `engine.nowhere.thing`.\n"
                    "```\ntools/not_checked_in_code_blocks.py\n```\n")
    assert links(page) == ["nowhere.md"]
    assert repo_paths(page) == {"engine/nowhere.py"}
    assert module_names(page) == {"engine.nowhere.thing"} and not module_exists("engine.nowhere.thing")
    assert module_exists("engine.config.KernelConfig") and importlib.util.find_spec("typer")
