"""Run a named module-level function of a test module in a fresh Python process, for what the
pytest process cannot do: read an environment variable the way a library does when it loads,
hold one torch.distributed rank a process, see a module as absent, or end with os._exit. The
function's arguments travel as strings on its command line; a failed assert is a non-zero exit
with the traceback on stderr.

    python tests/fresh.py tests/engine/test_x.py helper_name [arg ...]
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(fn, *args, dash_m: bool = False) -> list[str]:
    """The command line that runs fn(*args), each argument as a string, in a fresh interpreter;
    with dash_m as `python -m fresh` (this folder on its PYTHONPATH), where `-m` behaves its own way."""
    head = ["-m", "fresh"] if dash_m else [str(Path(__file__).resolve())]
    return [sys.executable, *head, sys.modules[fn.__module__].__file__, fn.__name__, *map(str, args)]


def run(fn, *args, cwd=ROOT, env=None, timeout=240) -> subprocess.CompletedProcess:
    """fn(*args) in a fresh interpreter, run to its end, its output captured as text."""
    return subprocess.run(command(fn, *args), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


class NoTorch:
    """A first import finder that refuses torch: put in a fresh process's sys.meta_path before
    anything imports torch, it makes torch as absent as in an environment without it."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


if __name__ == "__main__":
    path, name, *argv = sys.argv[1:]
    # the working directory first, as for `python -c`: the tree a test runs in (a copy of the engine,
    # say) is the one imported; this repository after everything else
    sys.path[1:1] = [os.getcwd()]
    sys.path.append(str(ROOT))
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    getattr(module, name)(*argv)
