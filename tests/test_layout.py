"""The module layout. The engine: no import cycle among engine modules at module level, nor one that
a function-level import hides (the lazy imports left keep triton or torch off paths that must not
need them, never dodge a cycle), and the scheduler never loads torch (it runs beside any backend).
The harness: folders by role whose imports point down only, a report that runs nothing, scenarios
that never import the report, a client that knows no scenario. Read from the source with ast:
nothing is imported."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
HARNESS = ROOT / "tensorfold_bench"


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
    assert "engine.cuda.prefill" in g["engine.models.qwen3"]  # (the lazy import of the CUDA cut attention)
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


# ---- the harness ----------------------------------------------------------------------------

# Each folder of tensorfold_bench (and its root modules) by layer: a module imports only from its own
# folder and from lower layers. Commands stand on the scenarios, the scenarios on the session
# driver, the driver on the client, the servers and the analysis; the report renders a receipt's
# data beside the driver and runs nothing.
LAYERS = {"__main__": 8, "cli": 7, "calibrate": 6, "scenarios": 5, "session": 4, "report": 4, "analysis": 3,
          "client": 2, "servers": 1, "workload": 1, "errors": 0, "receipt": 0, "tensorfold_bench": 0}
# what sends a request, starts a server or plays a run: never imported by the report
RUNS = ("tensorfold_bench.client.stream", "tensorfold_bench.client.play", "tensorfold_bench.client.wire",
        "tensorfold_bench.client.workers", "tensorfold_bench.servers.launcher", "tensorfold_bench.servers.lifeline",
        "tensorfold_bench.servers.identity", "tensorfold_bench.session", "tensorfold_bench.scenarios",
        "tensorfold_bench.cli", "tensorfold_bench.calibrate")


def harness_graph() -> dict[str, set[str]]:
    """harness module -> the harness modules it imports anywhere, in functions too (a package's face
    that only hands names on is left out: `from tensorfold_bench.session import driver` is an arrow
    to the driver)."""
    files = {_module(p): p for p in HARNESS.rglob("*.py")}
    names = set(files)
    faces = {_module(p) for p in HARNESS.rglob("__init__.py")}
    return {mod: {i for i in _all_imports(path, names) if i in names and i not in faces and i != mod}
            for mod, path in files.items()}


def runs(mod: str) -> bool:
    return any(mod == r or mod.startswith(r + ".") for r in RUNS)


def layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_harness_root_holds_few_modules_and_no_name_of_a_folder():
    root = sorted(p.stem for p in HARNESS.glob("*.py"))
    assert len(root) <= 8, root
    inner = {p.stem for p in HARNESS.glob("*/*.py")} | {p.name for p in HARNESS.iterdir() if p.is_dir()}
    assert not (set(root) - {"__init__", "__main__"}) & inner
    assert {layer(m) for m in harness_graph()} <= set(LAYERS), "a new folder needs its layer"


def test_harness_imports_point_down_only():
    back = sorted((m, i) for m, deps in harness_graph().items() for i in deps
                  if layer(i) != layer(m) and LAYERS[layer(i)] >= LAYERS[layer(m)])
    assert back == []
    assert cycles(harness_graph()) == []


def test_the_report_runs_nothing_and_no_scenario_imports_it():
    g = harness_graph()
    assert "tensorfold_bench.analysis.figures" in g["tensorfold_bench.report.long_prompt"]
    report = {m: sorted(i for i in deps if runs(i)) for m, deps in g.items() if layer(m) == "report"}
    assert {m: d for m, d in report.items() if d} == {}
    scenarios = {m: sorted(i for i in deps if layer(i) == "report") for m, deps in g.items() if layer(m) == "scenarios"}
    assert {m: d for m, d in scenarios.items() if d} == {}


def test_the_client_knows_no_scenario_session_or_report():
    """It plays requests (a workload's, for the arrival player) and keeps raw records, nothing more."""
    g = harness_graph()
    assert {layer(i) for m, deps in g.items() if layer(m) == "client" for i in deps} <= {"client", "workload", "errors"}


def test_the_layer_check_sees_a_back_arrow():
    g = {"tensorfold_bench.client.stream": {"tensorfold_bench.scenarios.sweep"}}
    back = [(m, i) for m, deps in g.items() for i in deps if LAYERS[layer(i)] >= LAYERS[layer(m)]]
    assert back == [("tensorfold_bench.client.stream", "tensorfold_bench.scenarios.sweep")]


def test_the_scheduler_reads_declared_capabilities_never_probes_the_backend():
    """What a backend offers is declared (backend.Capabilities); a probe with getattr/hasattr would
    let a new backend (a fake, the simulator's) offer something the protocol never names."""
    probes = []
    for path in sorted((ENGINE / "scheduler").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                probes.append(f"{path.name}:{node.lineno}")
    assert probes == []


def _packages(g: dict[str, set[str]], names: tuple[str, ...]) -> dict[str, set[str]]:
    """The import graph folded onto packages: engine.cpu.round -> engine.cpu, and so on."""
    def pkg(m: str) -> str | None:
        return next((n for n in names if m == n or m.startswith(n + ".")), None)
    out: dict[str, set[str]] = {n: set() for n in names}
    for mod, deps in g.items():
        if (a := pkg(mod)) is not None:
            out[a] |= {b for d in deps if (b := pkg(d)) is not None and b != a}
    return out


def test_models_and_the_cpu_kernels_do_not_import_each_other():
    """The model names its math; the CPU kernels implement it: one direction only, in functions too."""
    folded = _packages(graph(anywhere=True), ("engine.models", "engine.cpu"))
    assert not ("engine.cpu" in folded["engine.models"] and "engine.models" in folded["engine.cpu"]), folded


def test_the_cpu_kernels_keep_no_module_state():
    """What a CPU runner chose and its scratch live in its CpuKernels (engine/cpu/kernels.py), not in
    module globals: no `global`, no module-level caches (functools.cache / lru_cache, an empty
    container to fill, or a lock). isa.cpuinfo caches /proc/cpuinfo, which is the machine's, not a runner's."""
    found = []
    for path in sorted((ENGINE / "cpu").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{path.name}:{node.lineno} global")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "cpuinfo":
                for d in node.decorator_list:
                    name = ast.unparse(d)
                    if "cache" in name:
                        found.append(f"{path.name}:{node.lineno} {name}")
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                v, text = node.value, ast.unparse(node.value)
                if text in ("[]", "{}") or (isinstance(v, ast.Call) and any(w in ast.unparse(v.func) for w in
                                                                            ("Lock", "dict", "list", "set", "deque"))):
                    found.append(f"{path.name}:{node.lineno} {text[:40]}")
    assert found == []


def test_the_environment_is_read_at_the_process_edge():
    """Below the CLI every setting is configuration: os.environ / os.getenv are read only in
    engine/cli.py (the process edge). Writes stay where the process must set a library's variable
    before it loads: the --cpu-isa cap (engine/cpu/isa.py, which compares what is set) and NCCL's
    (engine/parallel/group.py)."""
    writers = {"cpu/isa.py", "parallel/group.py"}
    reads = []
    for path in sorted(ENGINE.rglob("*.py")):
        rel = str(path.relative_to(ENGINE))
        if rel == "cli.py" or rel in writers:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and ast.unparse(node.value) == "os":
                reads.append(f"{rel}:{node.lineno}")
    assert reads == []
