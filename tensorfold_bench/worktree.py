"""Where a variant's engine comes from: the working tree, or a git ref checked out in a worktree;
and variants read from a YAML file.

A variant that names a git ref of this repository runs that commit's engine: the ref is
resolved to its full commit and checked out with `git worktree add --detach` into
`.worktrees/<12-hex short sha>` at the repository's top (git-ignored). The worktree is reused
by every later variant or run of the same commit; a broken or stale one is removed and made
again. The working tree (the current checkout) is a source too: its HEAD commit plus a dirty
flag (uncommitted changes to tracked files, or untracked files git does not ignore).

Variants file (`--variants FILE`), YAML, a list or a mapping by name:

```yaml
- name: main
  ref: main            # optional: a git ref of this repository; absent = the working tree
  flags: [--prefill-mode, whole]   # or one string: "--prefill-mode whole"
  env: {TENSORFOLD_PREFILL_SHARE: "0.5"}
- name: new
  flags: --prefill-mode stepped --prefill-share 0.5
```
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from tensorfold_bench.errors import BenchError

WORKTREES = ".worktrees"
SHORT = 12


class GitError(BenchError):
    """A git operation a variant needed failed: the message says which and why."""


@dataclass(frozen=True)
class Source:
    """The engine source a variant runs: a directory, the commit it holds, and how it got there."""

    path: str
    commit: str | None  # full sha; None outside a git repository
    ref: str | None = None  # the ref asked for; None for the working tree
    dirty: bool = False  # the working tree only: uncommitted changes

    @property
    def label(self) -> str:
        c = (self.commit or "no git")[:SHORT]
        if self.ref is None:
            return f"working tree @ {c}{' + uncommitted changes' if self.dirty else ''}"
        return f"{self.ref} @ {c}"

    def to_dict(self) -> dict:
        return asdict(self)

    def __fspath__(self) -> str:  # Path(source) is its directory
        return self.path


def git(repo: str | Path, *args: str, check: bool = True) -> str:
    try:
        p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    if check and p.returncode != 0:
        raise GitError(f"git {' '.join(args)}: {(p.stderr or p.stdout).strip() or 'failed'}")
    return p.stdout.strip()


def repo_root(start: str | Path | None = None) -> Path:
    start = Path(start or Path(__file__).resolve().parent.parent)
    return Path(git(start, "rev-parse", "--show-toplevel"))


def resolve(ref: str, repo: str | Path) -> str | None:
    """The full commit `ref` names, or None when it names none."""
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def working_tree(repo: str | Path | None = None) -> Source:
    """The current checkout: its HEAD commit and whether it has uncommitted changes."""
    try:
        root = repo_root(repo)
    except GitError:
        return Source(str(Path(repo or Path(__file__).resolve().parent.parent)), None)
    head = resolve("HEAD", root)
    status = git(root, "status", "--porcelain", "--untracked-files=normal")
    return Source(str(root), head, None, bool(status))


@contextlib.contextmanager
def _lock(root: Path):
    d = root / WORKTREES
    d.mkdir(exist_ok=True)
    with open(d / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def checkout(ref: str, repo: str | Path | None = None) -> Source:
    """`ref` checked out (detached) in `.worktrees/<short sha>`, made once per commit and reused."""
    root = repo_root(repo)
    commit = resolve(ref, root)
    if commit is None:
        raise GitError(f"{ref!r} is not a commit of {root}")
    path = root / WORKTREES / commit[:SHORT]
    with _lock(root):
        if path.exists():
            if resolve("HEAD", path) == commit and not git(path, "status", "--porcelain", check=False):
                return Source(str(path), commit, ref)
            git(root, "worktree", "remove", "--force", str(path), check=False)
            shutil.rmtree(path, ignore_errors=True)
        git(root, "worktree", "prune")
        git(root, "worktree", "add", "--detach", "--force", str(path), commit)
    return Source(str(path), commit, ref)


def source(ref: str | None, repo: str | Path | None = None) -> Source:
    """A variant's source: the working tree when `ref` is None, else the ref's worktree."""
    return working_tree(repo) if ref is None else checkout(ref, repo)


@dataclass
class VariantSpec:
    """One entry of a variants file; `tensorfold_bench.variants.Variant` is made from it."""

    name: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ref: str | None = None


def _flags(path: str, name: str, x) -> list[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return shlex.split(x)
    if isinstance(x, list) and all(isinstance(a, (str, int, float)) for a in x):
        return [str(a) for a in x]
    raise BenchError(f"{path}: {name}: flags must be a list of strings or one string")


def parse_variants(text: str, path: str = "<variants>") -> list[VariantSpec]:
    """Validate a variants file's YAML (see the module docstring)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise BenchError(f"{path}: not valid YAML: {e}") from None
    if isinstance(doc, dict):
        doc = [{"name": k, **(v or {})} for k, v in doc.items()]
    if not isinstance(doc, list) or not doc:
        raise BenchError(f"{path}: expected a list of variants (name, ref, flags, env)")
    out, seen = [], set()
    for i, d in enumerate(doc):
        if not isinstance(d, dict) or not d.get("name"):
            raise BenchError(f"{path}: entry {i + 1}: expected a mapping with a name")
        name = str(d["name"])
        unknown = set(d) - {"name", "ref", "flags", "args", "env"}
        if unknown:
            raise BenchError(f"{path}: {name}: unknown key(s) {', '.join(sorted(unknown))} "
                             "(known: name, ref, flags, env)")
        if name in seen:
            raise BenchError(f"{path}: {name}: defined twice")
        seen.add(name)
        env = d.get("env") or {}
        if not isinstance(env, dict):
            raise BenchError(f"{path}: {name}: env must be a mapping")
        ref = d.get("ref")
        out.append(VariantSpec(name, _flags(path, name, d.get("flags", d.get("args"))),
                               {str(k): str(v) for k, v in env.items()},
                               None if ref is None else str(ref)))
    return out


def read_variants(path: str | Path) -> list[VariantSpec]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise BenchError(f"{path}: cannot read: {e.strerror}") from None
    return parse_variants(text, str(path))
