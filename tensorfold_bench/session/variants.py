"""Variants (named engine configurations), read from flags or a YAML file, and the order runs go in.

Variants file (`--variants FILE`), YAML, a list or a mapping by name:

```yaml
- name: main
  ref: main            # optional: a git ref of this repository; absent = the working tree
  flags: [--prefill-mode, whole]   # or one string: "--prefill-mode whole"
  env: {TENSORFOLD_PREFILL_SHARE: "0.5"}
- name: new
  flags: --prefill-mode stepped --prefill-share 0.5
- name: vllm               # any server: `command` (argv list or one string) instead of tfengine
  command: [python, -m, vllm.entrypoints.openai.api_server, --model, "{model}",
            --host, "{host}", --port, "{port}"]
  flags: [--max-num-batched-tokens, "512"]      # appended to the command
  env: {VLLM_CPU_KVCACHE_SPACE: "2"}
  health: /health          # default: /health, then /v1/models
  start_timeout: 600       # seconds until healthy (default 300)
```

A command must say `{port}` (tfbench picks a free port and proves the listener is the launched
process group's); `{host}`, and the shared `--model`, `--dtype` and `--max-model-len` as
`{model}`, `{dtype}` and `{max_model_len}`, are filled in too, and `$VAR` / `${VAR}` are
expanded from tfbench's environment (which every server inherits, `env:` on top). The shared tfengine flags are
never applied to a command variant: what it runs is its command line, as the receipt shows.
"""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from tensorfold_bench.errors import BenchError, FlagError


@dataclass(frozen=True)
class Variant:
    """A named engine configuration: flags and environment on top of the shared engine flags,
    and optionally a git ref of this repository (run from its own worktree: tensorfold_bench/servers/worktree.py)."""

    name: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ref: str | None = None
    command: list[str] | None = None  # any server's argv ({port} etc. unfilled); None: tfengine
    health: list[str] | None = None  # health paths tried in turn (None: the launcher's default)
    start_timeout: float | None = None  # seconds until healthy (None: the launcher's default)
    url: str | None = None  # --url: a running server, nothing launched

    @property
    def launched(self) -> bool:
        return self.url is None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Variant":
        return cls(name=d["name"], args=list(d.get("args", [])), env=dict(d.get("env", {})), ref=d.get("ref"),
                   command=d.get("command"), health=d.get("health"), start_timeout=d.get("start_timeout"),
                   url=d.get("url"))


WHOLE = Variant("whole", ["--prefill-mode", "whole"])


def share_name(p: float) -> str:
    return f"stepped p={p:g}"


def stepped(p: float) -> Variant:
    return Variant(share_name(p), ["--prefill-mode", "stepped", "--prefill-share", f"{p:g}"])


def mixed_name(budget_ms: float) -> str:
    return f"mixed budget={budget_ms:g}"


def mixed(budget_ms: float) -> Variant:
    """The engine's mixed forwards (a prompt's cut and every stream's row in one forward) at a budget."""
    return Variant(mixed_name(budget_ms), ["--prefill-mode", "mixed", "--mixed-budget", f"{budget_ms:g}"])


def split_name(sms: int) -> str:
    return f"split sms={sms}"


def split(sms: int) -> Variant:
    """The engine's split SMs (a long prompt's cuts on the GPU's other SMs beside rounds on `sms`)."""
    return Variant(split_name(sms), ["--prefill-mode", "split", "--decode-sms", str(sms)])


def parse_sms(flag: str, text: str) -> list[int]:
    """'16,32' -> [16, 32]: each a positive multiple of 8 SMs (the partition's granularity), none repeated."""
    def check(v: float) -> str | None:
        return None if v > 0 and v == int(v) and int(v) % 8 == 0 else "is not a positive multiple of 8 SMs"
    return [int(v) for v in _number_list(flag, text, "16,32,48: decode SMs", check)]


def parse_budgets(flag: str, text: str) -> list[float]:
    """'40,80' -> [40.0, 80.0]: each a positive number of milliseconds, none repeated."""
    def check(v: float) -> str | None:
        return None if 0 < v < float("inf") else "is not a positive number of milliseconds"
    return _number_list(flag, text, "40,80: milliseconds a forward", check)


def plain(base: Variant) -> Variant:
    """The plain reference: the base's source, one stream, whole prompts, no cache, no drafts."""
    return Variant("plain", list(base.args) + ["--prefill-mode", "whole", "--no-prompt-cache",
                                               "--no-drafts", "--parallel", "1"], dict(base.env), base.ref)


def url_variants(urls: list[str], name_of) -> list[Variant]:
    """`--url URL` or `--url NAME=URL` (repeatable), in the order given: one variant each, named
    NAME, else `name_of(url)` (the server's own name)."""
    out = []
    for u in urls:
        name, sep, url = u.partition("=")
        if not sep or "://" in name:
            name, url = "", u
        out.append(Variant(name.strip() or name_of(url.strip()), url=url.strip()))
    names = [v.name for v in out]
    for n in names:
        if names.count(n) > 1:
            raise FlagError("--url", f"two servers are both named {n!r}: give each a name, --url NAME=URL")
    return out


MIN_SHARE = 0.01  # the engine treats a share below this as 1: refuse it rather than mislabel the run


def parse_floats(flag: str, text: str) -> list[float]:
    """'1,0.75,0.5' -> [1.0, 0.75, 0.5]; each a share in [0.01, 1]. Empty is an error, not the default."""
    def check(v: float) -> str | None:
        if MIN_SHARE <= v <= 1.0:  # NaN fails too
            return None
        why = " (the engine runs a share below 0.01 as 1)" if 0 < v < MIN_SHARE else ""
        return f"is outside [{MIN_SHARE:g}, 1]{why}"
    return _number_list(flag, text, "1,0.75,0.5", check)


def _number_list(flag: str, text: str, example: str, check) -> list[float]:
    """A comma list of numbers for `flag`, each passing check (None, or why not), none repeated."""
    if not text.strip():
        raise FlagError(flag, f"empty (expected e.g. {example})")
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = float(part)
        except ValueError:
            raise FlagError(flag, f"{part!r} is not a number (expected e.g. {example})") from None
        why = check(v)
        if why:
            raise FlagError(flag, f"{part} {why}")
        out.append(v)
    if len(set(out)) != len(out):
        raise FlagError(flag, f"{text!r} repeats a value")
    return out


def share_variants(shares: list[float]) -> tuple[Variant, list[Variant]]:
    """The base (whole prompts) and one stepped variant per share."""
    return WHOLE, [stepped(p) for p in shares]


def default_order(base: Variant, news: list[Variant]) -> list[str]:
    """base, news..., reversed news..., base: for one new side, base/new/new/base, so a drift of
    the machine hits both sides alike."""
    names = [v.name for v in news]
    return [base.name] + names + names[::-1] + [base.name]


def parse_order(text: str, variants: list[Variant]) -> list[str]:
    """`--order` as a comma sequence of variant names; 'base' and 'new' alias the base and the
    only new variant."""
    if not text.strip():
        raise FlagError("--order", "empty (expected a comma sequence of variant names, e.g. base,new,new,base)")
    by_name = {v.name: v for v in variants}
    aliases = {"base": variants[0].name}
    if len(variants) == 2:
        aliases["new"] = variants[1].name
    out = []
    for part in text.split(","):
        part = part.strip()
        name = aliases.get(part, part)
        if name not in by_name:
            raise FlagError("--order", f"unknown variant {part!r}; known: {', '.join(by_name)}")
        out.append(name)
    if not out:
        raise FlagError("--order", "empty")
    return out


def with_aa(variants: list[Variant], order: list[str]) -> tuple[list[Variant], list[str]]:
    """`--aa`: a copy of the base named '<base> A/A', run twice before a last base run, so its
    verdict against the base is the noise floor of the same build and flags."""
    base = variants[0]
    aa = replace(base, name=f"{base.name} A/A")
    return [*variants, aa], [*order, aa.name, aa.name, base.name]


def select_variants(share: str | None, variants_file: str | None = None, base_ref: str | None = None,
                    new_ref: str | None = None, default_share: str = "0.5", budgets: str | None = None,
                    sms: str | None = None) -> list[Variant]:
    """The variants a command compares, the base first:
    - `--variants FILE`: from the YAML file (the first entry is the base);
    - `--base REF` / `--new REF` without `--share`: two builds with the engine's default flags,
      'base' at REF (or the working tree) and 'new' at REF (or the working tree);
    - otherwise whole prompts against stepped prompts at each `--share` value, `--base` / `--new`
      then naming the refs the base and every new variant run from;
    - `--mixed B,...` adds a variant 'mixed budget=B' a value after those, `--split N,...` a variant
      'split sms=N' a value after those (either without `--share`: beside whole alone)."""
    if variants_file:
        if share is not None or budgets is not None or sms is not None or base_ref or new_ref:
            raise FlagError("--variants", "give either --variants FILE or --share/--mixed/--split/--base/--new, not both")
        return read_variants(variants_file)
    if share is None and budgets is None and sms is None and (base_ref or new_ref):
        return [Variant("base", [], {}, base_ref), Variant("new", [], {}, new_ref)]
    base, news = share_variants(parse_floats("--share", default_share if share is None else share)
                                if share is not None or (budgets is None and sms is None) else [])
    news += [mixed(b) for b in (parse_budgets("--mixed", budgets) if budgets is not None else [])]
    news += [split(n) for n in (parse_sms("--split", sms) if sms is not None else [])]
    return [replace(base, ref=base_ref), *[replace(n, ref=new_ref) for n in news]]


def order_for(variants: list[Variant], order: str | None, aa: bool = False) -> tuple[list[Variant], list[str]]:
    """`--order` (any sequence of names), else base/news/reversed news/base; `--aa` appended."""
    names = parse_order(order, variants) if order is not None else default_order(variants[0], variants[1:])
    return with_aa(variants, names) if aa else (variants, names)


KEYS = ("name", "ref", "flags", "args", "env", "command", "health", "start_timeout")


def _flags(path: str, name: str, x, what: str = "flags") -> list[str]:
    if x is None:
        return []
    if isinstance(x, str):
        try:
            return shlex.split(x)
        except ValueError as e:  # an unterminated quote
            raise BenchError(f"{path}: {name}: flags {x!r}: {e}") from None
    if isinstance(x, list) and all(isinstance(a, (str, int, float)) for a in x):
        return [str(a) for a in x]
    raise BenchError(f"{path}: {name}: {what} must be a list of strings or one string")


def _launch_keys(path: str, name: str, d: dict) -> dict:
    """command, health and start_timeout of one entry, checked."""
    out: dict = {}
    if d.get("command") is not None:
        cmd = _flags(path, name, d["command"], "command")
        if not cmd:
            raise BenchError(f"{path}: {name}: command is empty")
        if not any("{port}" in a for a in cmd):
            raise BenchError(f"{path}: {name}: command must say {{port}} (tfbench picks the port)")
        if d.get("ref") is not None:
            raise BenchError(f"{path}: {name}: ref applies to tfengine only, not to a command")
        out["command"] = cmd
    elif d.get("health") is not None or d.get("start_timeout") is not None:
        raise BenchError(f"{path}: {name}: health and start_timeout need a command")
    if d.get("health") is not None:
        h = [d["health"]] if isinstance(d["health"], str) else d["health"]
        if not isinstance(h, list) or not h or not all(isinstance(x, str) and x.startswith("/") for x in h):
            raise BenchError(f"{path}: {name}: health must be a path (/health) or a list of paths")
        out["health"] = list(h)
    if d.get("start_timeout") is not None:
        t = d["start_timeout"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            raise BenchError(f"{path}: {name}: start_timeout must be a positive number of seconds")
        out["start_timeout"] = float(t)
    return out


def one_line(e: Exception) -> str:
    """A YAML error's message on one line (PyYAML spreads it over several, with a caret)."""
    return " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip() and ln.strip() != "^")


def parse_variants(text: str, path: str = "<variants>") -> list[Variant]:
    """Validate a variants file's YAML (see the module docstring)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise BenchError(f"{path}: not valid YAML: {one_line(e)}") from None
    if isinstance(doc, dict):
        bad = [k for k, v in doc.items() if v is not None and not isinstance(v, dict)]
        if bad:
            raise BenchError(f"{path}: {bad[0]}: expected a mapping (ref, flags, env), got {doc[bad[0]]!r}")
        doc = [{"name": k, **(v or {})} for k, v in doc.items()]
    if not isinstance(doc, list) or not doc:
        raise BenchError(f"{path}: expected a list of variants (name, ref, flags, env)")
    out, seen = [], set()
    for i, d in enumerate(doc):
        if not isinstance(d, dict) or not d.get("name"):
            raise BenchError(f"{path}: entry {i + 1}: expected a mapping with a name")
        name = str(d["name"])
        unknown = set(d) - set(KEYS)
        if unknown:
            raise BenchError(f"{path}: {name}: unknown key(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(k for k in KEYS if k != 'args')})")
        if name in seen:
            raise BenchError(f"{path}: {name}: defined twice")
        seen.add(name)
        env = d.get("env") or {}
        if not isinstance(env, dict):
            raise BenchError(f"{path}: {name}: env must be a mapping")
        ref = d.get("ref")
        out.append(Variant(name, _flags(path, name, d.get("flags", d.get("args"))),
                           {str(k): str(v) for k, v in env.items()}, None if ref is None else str(ref),
                           **_launch_keys(path, name, d)))
    return out


def read_variants(path: str | Path) -> list[Variant]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise BenchError(f"{path}: cannot read: {e.strerror}") from None
    return parse_variants(text, str(path))
