"""Where a variant's engine comes from: the working tree, or a git ref checked out in a worktree.

A variant that names a git ref of this repository runs that commit's engine: the ref is
resolved to its full commit and checked out with `git worktree add --detach` into
`.worktrees/<12-hex short sha>` at the repository's top (git-ignored). The worktree is reused
by every later variant or run of the same commit; a broken or stale one is removed and made
again. The working tree (the current checkout) is a source too: its HEAD commit plus a dirty
flag (uncommitted changes to tracked files, or untracked files git does not ignore).
"""
from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

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
    start = Path(start or Path(__file__).resolve().parents[2])
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
        return Source(str(Path(repo or Path(__file__).resolve().parents[2])), None)
    return Source(str(root), resolve("HEAD", root), None, dirty(root))


def dirty(path: str | Path) -> bool:
    """Uncommitted changes to tracked files, or untracked files git does not ignore: the one
    probe (a working tree's label, a reused worktree's check, the receipt's harness commit)."""
    return bool(git(path, "status", "--porcelain", "--untracked-files=normal", check=False))


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
            if resolve("HEAD", path) == commit and not dirty(path):
                return Source(str(path), commit, ref)
            git(root, "worktree", "remove", "--force", str(path), check=False)
            shutil.rmtree(path, ignore_errors=True)
        git(root, "worktree", "prune")
        git(root, "worktree", "add", "--detach", "--force", str(path), commit)
    return Source(str(path), commit, ref)


def source(ref: str | None, repo: str | Path | None = None) -> Source:
    """A variant's source: the working tree when `ref` is None, else the ref's worktree."""
    return working_tree(repo) if ref is None else checkout(ref, repo)
