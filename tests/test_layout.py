"""The engine's module layout: no import cycle among engine modules at module level, nor one that a
function-level import hides (the lazy imports left keep triton or torch off paths that must not
need them, never dodge a cycle), and the scheduler never loads torch (it runs beside any backend).
Read from the source with ast: nothing is imported."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, names: set[str]) -> set[str]:
    """The modules `path` imports at module level (also inside if / try at the top, not in functions),
    resolved to modules (`from engine.cuda import ring` names engine.cuda.ring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))
    visit(tree.body)
    return out


def _all_imports(path: pathlib.Path, names: set[str]) -> set[str]:
    """Every module `path` imports anywhere, in functions too (absolute imports: the engine's style)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in names)
    return out


def graph(anywhere: bool = False) -> dict[str, set[str]]:
    """engine module -> the engine modules it imports at module level (anywhere: in functions too)."""
    files = {_module(p): p for p in ENGINE.rglob("*.py")}
    names = set(files)
    g = {}
    for mod, path in files.items():
        deps = set()
        for imp in (_all_imports if anywhere else _imports)(path, names):
            # importing a.b.c runs a and a.b first
            parts = imp.split(".")
            deps.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in names)
        g[mod] = deps - {mod}
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_engine_modules():
    g = graph()
    assert "engine.cuda.decode_attention" in g and "engine.cuda.launch" in g["engine.cuda.decode_attention"]
    assert cycles(g) == []


def test_no_function_level_import_hides_a_cycle():
    """With the imports inside functions counted too there is still no cycle: none of them is there
    to dodge one (engine.config <-> engine.models.hf_config and engine.cuda.decode_attention <->
    engine.cuda.prefetch were)."""
    g = graph(anywhere=True)
    assert "engine.cuda.kernels" in g["engine.models.qwen3"]  # (the lazy import of the CUDA kernels)
    assert cycles(g) == []


def test_the_scheduler_loads_no_torch():
    g = graph()
    seen, todo = set(), [m for m in g if m.startswith("engine.scheduler")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(g[m])
    files = {_module(p): p for p in ENGINE.rglob("*.py")}
    direct = {m: {i.split(".")[0] for i in _imports(files[m], set(files))} for m in seen}
    heavy = {m: sorted(d & {"torch", "triton", "numpy"}) for m, d in direct.items() if d & {"torch", "triton", "numpy"}}
    assert heavy == {}, heavy


def test_the_scheduler_reads_declared_capabilities_never_probes_the_backend():
    """What a backend offers is declared (backend.Capabilities); a probe with getattr/hasattr would
    let a new backend (a fake, the simulator's) offer something the protocol never names."""
    probes = []
    for path in sorted((ENGINE / "scheduler").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                probes.append(f"{path.name}:{node.lineno}")
    assert probes == []
