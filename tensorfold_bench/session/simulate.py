"""A session in virtual time (`--sim PROFILE`): each variant's tfengine flags become an
`EngineConfig` and the profile's capabilities, and each run is played by the virtual-time player
(client.virtual) on the engine's real lane host instead of a launched server. The driver replaces
its `serve` seam with `SimTarget.run_for`; the scenarios play the same streams as `SimRequest`s
and measure the same raw records.

What a simulation cannot know is said in every simulated receipt (`CANNOT_KNOW`): token
identities (the simulated backend's ids are a hash, so exactness is not judged), the client's own
latency and the server's HTTP thread (neither is in a profile).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import yaml

from engine.config import ConfigError, EngineConfig
from engine.scheduler.backend import Capabilities
from engine.scheduler.costs import Costs, Profile, ProfileError
from tensorfold_bench.client.virtual import needs
from tensorfold_bench.errors import FlagError
from tensorfold_bench.session.variants import Variant

CANNOT_KNOW = (
    "Token identities: the simulated backend's ids are a hash of the position, so exactness is not judged "
    "(the real runs' job).",
    "The client's own latency (HTTP, its event loop): not in the profile; every time is the token's emission.",
    "The server's HTTP thread taking the host's time while it parses a request: only the profile's "
    "per-prompt-token intake is charged.",
    "Clocks that change with load beyond the power cap a sustained fill meets (the profile's fill, where "
    "it has one), and other processes on the machine.",
    "Two forwards sharing the SMs: a whole-device forward beside a split cut takes its own time and "
    "holds the cut back by all of it.",
)

# tfengine flags that change nothing in the schedule: taken and ignored under --sim
IGNORED = {"--model": 1, "--device": 1, "--dtype": 1, "--seed": 1, "--trace": 0, "--trace-len": 1,
           "--load-format": 1, "--cut-attention": 1, "--mixed-low-tiles": 0, "--cpu-isa": 1, "--threads": 1,
           "--max-body-mb": 1, "--stall-timeout-s": 1, "--idle-timeout-s": 1, "--body-timeout-s": 1,
           "--host": 1, "--port": 1}

# flags of a tfbench command that a simulation refuses (nothing is launched or reached), and why
REFUSED = {
    "--url": "a simulation launches and reaches no server",
    "--plain-check": "the plain reference compares token identities, which a simulation does not know",
    "--base": "a simulation runs this tree's scheduler (the gate's schedule layer compares two trees)",
    "--new": "a simulation runs this tree's scheduler (the gate's schedule layer compares two trees)",
    "--tensor-parallel": "a profile times one engine process",
    "--aa": "a simulation is deterministic: an A/A pair is equal by construction",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    p.add_argument("--prefill-mode")
    p.add_argument("--prefill-share", type=float)
    p.add_argument("--mixed-budget", type=float)
    p.add_argument("--decode-sms", type=int)
    p.add_argument("--parallel", type=int)
    p.add_argument("--prefill-rows", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--no-prompt-cache", action="store_true")
    p.add_argument("--drafter")
    p.add_argument("--no-drafts", action="store_true")
    for flag, takes_value in IGNORED.items():
        p.add_argument(flag, dest="ignored" + flag.replace("-", "_"), **({} if takes_value else {"action": "store_true"}))
    return p


def refuse_flags(given: dict[str, bool]) -> None:
    """A FlagError for the first flag given (flag -> whether it was) that a simulation refuses."""
    for flag, was in given.items():
        if was:
            raise FlagError(flag, f"not with --sim: {REFUSED[flag]}")


@dataclass
class SimRun:
    """What one run plays on: its engine configuration and capabilities, the profile's costs."""

    cfg: EngineConfig
    caps: Capabilities
    costs: Costs
    vocab: int


@dataclass
class SimTarget:
    """The profile a session is simulated on."""

    path: Path
    costs: Costs

    @classmethod
    def load(cls, path: Path | str) -> "SimTarget":
        try:
            return cls(Path(path), Costs(Profile.load(Path(path))))
        except ProfileError as e:
            raise FlagError("--sim", str(e)) from None

    @property
    def profile(self) -> Profile:
        return self.costs.profile

    @property
    def device(self) -> str:
        return str(self.profile.device.get("type") or "cpu")

    @property
    def model(self) -> str:
        return str(self.profile.model.get("name") or "")

    @property
    def vocab(self) -> int:
        return int(self.profile.model.get("vocab") or 151_936)

    def split_sms(self) -> list[int]:
        """The decode partitions the profile's split samples were measured at."""
        return sorted({int(r[0]) for r in self.profile.samples.get("split") or []})

    def describe(self) -> dict:
        """The receipt's `simulated` field: the profile, and what the simulation cannot know."""
        p = self.profile
        return {"profile": str(self.path), "device": p.device.get("name"), "device_type": self.device,
                "model": p.model.get("name"), "engine_commit": p.engine.get("commit"), "source": p.source,
                "created": p.created, "fits": self.costs.summary(), "cannot_know": list(CANNOT_KNOW)}

    def config(self, variant: Variant, shared: list[str]) -> SimRun:
        """The variant's engine configuration (the shared flags, then its own) and the profile's
        capabilities; a flag, kind or source the simulation cannot play is one FlagError."""
        where = f"variant {variant.name!r}"
        if variant.command is not None:
            raise FlagError("--sim", f"{where} runs its own command; a simulation plays tfengine's scheduler only")
        if variant.ref is not None:
            raise FlagError("--sim", f"{where} runs git ref {variant.ref}; a simulation runs this tree's scheduler")
        if variant.env:
            raise FlagError("--sim", f"{where} sets {', '.join(sorted(variant.env))}: a simulation charges the "
                                     "profile's costs, not an environment's")
        try:
            ns, unknown = _parser().parse_known_args(list(shared) + list(variant.args))
        except (argparse.ArgumentError, ValueError) as e:
            raise FlagError("--sim", f"{where}: {e}") from None
        if unknown:
            raise FlagError("--sim", f"{where}: {' '.join(unknown)} is not a flag the simulation knows")
        pe = self.profile.engine
        try:
            cfg = EngineConfig(model=self.model or "tiny", device=self.device,
                               dtype=str(self.profile.model.get("dtype") or "float32"),
                               parallel=ns.parallel or int(pe.get("parallel") or 4),
                               max_model_len=ns.max_model_len or int(pe.get("max_model_len") or 4096),
                               prefill_rows=ns.prefill_rows or int(pe.get("prefill_rows") or 256),
                               prefill_mode=ns.prefill_mode or "stepped",
                               prefill_share=1.0 if ns.prefill_share is None else ns.prefill_share,
                               mixed_budget_ms=50.0 if ns.mixed_budget is None else ns.mixed_budget,
                               decode_sms=32 if ns.decode_sms is None else ns.decode_sms,
                               prompt_cache=not ns.no_prompt_cache, drafter=ns.drafter, drafts=not ns.no_drafts)
        except ConfigError as e:
            raise FlagError("--sim", f"{where}: {e}") from None
        c = self.costs
        caps = c.capabilities(cfg.prefill_mode, cfg.parallel)
        for kind in ("mixed", "split"):
            if cfg.prefill_mode == kind and not c.has(kind):
                raise FlagError("--sim", f"profile {self.path} has no {kind} samples, so {where} "
                                         f"({kind} forwards) cannot be simulated on it")
        try:
            needs(c, cfg, caps)
        except ProfileError as e:
            raise FlagError("--sim", f"{where}: {e}") from None
        return SimRun(cfg, caps, c, self.vocab)


# ---- predictions computed from the simulation (--predict sim:PROFILE) ---------------------------

class ScaledCosts:
    """A profile's costs, every call's times `factor` (the fits stay the profile's own)."""

    def __init__(self, costs: Costs, factor: float):
        self.costs, self.factor, self.profile = costs, factor, costs.profile

    def __getattr__(self, name):
        return getattr(self.costs, name)

    def prefill(self, *a):
        return self.costs.prefill(*a) * self.factor

    def decode(self, *a, **k):
        return self.costs.decode(*a, **k) * self.factor

    def prefill_many(self, *a):
        return self.costs.prefill_many(*a) * self.factor

    def mixed(self, *a):
        return self.costs.mixed(*a) * self.factor

    def split(self, *a):
        return self.costs.split(*a) * self.factor

    def split_round(self, *a):
        return self.costs.split_round(*a) * self.factor

    @property
    def host_turn(self):
        return self.costs.host_turn * self.factor

    @property
    def host_token(self):
        return self.costs.host_token * self.factor

    @property
    def host_prompt_token(self):
        return self.costs.host_prompt_token * self.factor


MIN_SPREAD = 0.02  # a range never narrower than this either side: the profile's fits are not exact


ALWAYS = ("prefill", "decode", "decode_ahead", "prefill_many")  # the kinds any schedule may charge


def spread(costs: Costs, modes: set[str] = frozenset()) -> float:
    """How far one call lands from the profile's fits: the widest 90th percentile of |relative
    residual| (Costs.summary) among the kinds the variants charge (prompt cuts and rounds, and
    mixed or split forwards where a variant's `modes` run them), at least MIN_SPREAD."""
    kinds = set(ALWAYS) | (set(modes) & {"mixed", "split"})
    return max([MIN_SPREAD, *(k["spread"] for name, k in costs.summary().items() if name.split()[0] in kinds)])


def ranges(simulate, costs: Costs, known: set[str] | None = None, modes: set[str] = frozenset()
           ) -> tuple[dict[str, dict[str, list[float]]], float]:
    """variant -> figure -> [lo, hi] from three simulations: on the profile's costs, and on every
    cost the profile's spread faster and slower; each range holds all three, and the nominal
    value the spread either side. `simulate(costs)`: variant -> figure -> value. A figure a
    simulation leaves unknown, or `known` does not name, is left out."""
    s = spread(costs, modes)
    runs = [simulate(costs), simulate(ScaledCosts(costs, 1 - s)), simulate(ScaledCosts(costs, 1 + s))]
    out: dict[str, dict[str, list[float]]] = {}
    for variant, figs in runs[0].items():
        for key, v in figs.items():
            if v is None or (known is not None and key not in known) or key + "_s" in figs:
                continue
            vals = [v, *(r.get(variant, {}).get(key) for r in runs[1:])]
            vals = [x for x in vals if x is not None] + [v * (1 - s), v * (1 + s)]
            out.setdefault(variant, {})[key] = [round(min(vals), 6), round(max(vals), 6)]
    return out, s


def write_predictions(path: Path, table: dict[str, dict[str, list[float]]], target: "SimTarget", s: float) -> Path:
    """The predictions file (analysis.predictions' YAML) with a header saying how it was computed."""
    p = target.profile
    head = (f"# Computed, not guessed: each range is this scenario and its variants simulated on the cost profile\n"
            f"# {target.path} ({p.device.get('name')}, {p.model.get('name')}, engine commit {p.engine.get('commit')}),\n"
            f"# on its costs and on every cost {s:.1%} faster and slower (the profile's spread); simulated figures.\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + yaml.safe_dump(table, sort_keys=False, default_flow_style=None), encoding="utf-8")
    return path
