"""Variants from git refs: worktrees made once per commit, and the ref's own engine is run."""
import subprocess
import textwrap
from pathlib import Path

import httpx
import pytest

from tensorfold_bench.servers import worktree

# A stand-in engine: `python -m engine serve --host H --port P ...` answering /health and
# telling which version of the source it is.
FAKE_ENGINE = textwrap.dedent('''\
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from engine.version import VERSION
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ok", "version": VERSION}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def sh(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "engine").mkdir(parents=True)
    sh(tmp_path, "init", "-q", "-b", "main", str(r))
    sh(r, "config", "user.email", "t@example.com")
    sh(r, "config", "user.name", "t")
    (r / ".gitignore").write_text("/.worktrees/\n__pycache__/\n")
    (r / "engine" / "__init__.py").write_text("")
    (r / "engine" / "__main__.py").write_text(FAKE_ENGINE)
    (r / "engine" / "version.py").write_text("VERSION = 1\n")
    sh(r, "add", "-A")
    sh(r, "commit", "-q", "-m", "one")
    sh(r, "tag", "v1")
    (r / "engine" / "version.py").write_text("VERSION = 2\n")
    sh(r, "commit", "-q", "-am", "two")
    return r


def test_checkout_a_ref_and_reuse_it(repo):
    src = worktree.checkout("v1", repo)
    commit = sh(repo, "rev-parse", "v1")
    assert src.commit == commit and src.ref == "v1"
    assert Path(src.path) == repo / ".worktrees" / commit[:12]
    assert (Path(src.path) / "engine" / "version.py").read_text() == "VERSION = 1\n"
    mtime = Path(src.path).stat().st_mtime_ns
    again = worktree.checkout(commit, repo)  # same commit by another name: the same worktree
    assert again.path == src.path and Path(src.path).stat().st_mtime_ns == mtime
    assert worktree.checkout("HEAD~1", repo).path == src.path
    assert "v1 @ " + commit[:12] == src.label
    # the worktree does not dirty the main checkout (.worktrees/ is ignored)
    assert worktree.working_tree(repo).dirty is False


def test_working_tree_commit_and_dirty(repo):
    wt = worktree.working_tree(repo)
    assert wt.commit == sh(repo, "rev-parse", "HEAD") and wt.ref is None and not wt.dirty
    (repo / "engine" / "version.py").write_text("VERSION = 3\n")
    assert worktree.working_tree(repo).dirty
    assert "uncommitted" in worktree.working_tree(repo).label


def test_a_broken_worktree_is_made_again(repo):
    src = worktree.checkout("v1", repo)
    (Path(src.path) / "engine" / "version.py").write_text("VERSION = 99\n")  # tampered
    again = worktree.checkout("v1", repo)
    assert (Path(again.path) / "engine" / "version.py").read_text() == "VERSION = 1\n"


def test_unknown_ref_is_a_clear_error(repo):
    with pytest.raises(worktree.GitError, match="'nope' is not a commit"):
        worktree.checkout("nope", repo)


def test_run_the_refs_engine(repo, tmp_path):
    """A variant built from a ref launches that commit's engine, not the working tree's."""
    from tensorfold_bench.servers import launcher

    for ref, version in (("v1", 1), ("main", 2), (None, 2)):
        src = worktree.source(ref, repo)
        with launcher.launch([], tmp_path / f"{ref}.log", root=Path(src.path),
                             start_timeout=30) as server:
            assert httpx.get(server.url + "/health").json()["version"] == version


# A stand-in engine that speaks --port-file/--nonce, as tfengine does (the launcher reads
# engine/cli.py to tell): it binds port 0 and writes the port where it is told.
PORT_FILE_ENGINE = textwrap.dedent('''\
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    port_file, nonce = args[args.index("--port-file") + 1], args[args.index("--nonce") + 1]
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ok", "nonce": nonce}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    srv = HTTPServer(("127.0.0.1", 0), H)
    with open(port_file, "w") as f:
        f.write(str(srv.server_address[1]))
    srv.serve_forever()
''')


def test_a_refs_engine_launches_with_a_relative_log_path(repo, tmp_path, monkeypatch):
    """The ref's engine runs in its worktree, so a relative log path (the gate's `runs/gate/...`)
    must reach it as an absolute one: as a relative --port-file it named a folder the worktree
    lacks, the base would not serve, and the gate fell back to A/A on every CI run."""
    from tensorfold_bench.servers import launcher

    (repo / "engine" / "__main__.py").write_text(PORT_FILE_ENGINE)
    (repo / "engine" / "cli.py").write_text("port_file = True  # speaks --port-file\n")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "-m", "port file")
    src = worktree.source("main", repo)
    monkeypatch.chdir(tmp_path)
    Path("runs/gate").mkdir(parents=True)
    with launcher.launch([], Path("runs/gate/run1-base.log"), root=Path(src.path), start_timeout=30) as server:
        assert httpx.get(server.url + "/health").json()["status"] == "ok"
        assert "nonce echoed by /v1/engine" in server.checked
