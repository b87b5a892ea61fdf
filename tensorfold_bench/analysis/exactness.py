"""Every token-hash comparison the harness makes: long-prompt runs against each other and the
plain reference, sweep replies across reps, levels and runs, the gate's sides.

Hash convention (TensorFold's): sha256 over the comma-joined decimal token ids of a reply
("12,7,900"), as hex. Servers report the first 12 hex characters (`token_sha`); we keep the
full hash and compare at 12 characters with a server's. `token_sha(ids)` is that one rule.

A stream that is cancelled (long-prompt's A, once B and C are done) varies in length from run to
run, so its reply is compared on a prefix: it equals the reference when its ids equal the
reference's first len(reply) ids (the plain reference's reply is generated as long as the
longest); long-prompt's A hash in the tables is over the first `a_prefix` ids, the shortest A
among the runs compared.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

from tensorfold_bench.client.stream import StreamRecord

SHORT = 12


def token_hash(ids: list[int]) -> str:
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()


def short(h: str | None) -> str | None:
    return h[:SHORT] if h else None


def token_sha(ids: list[int]) -> str:
    """The server-side convention: the first 12 hex of token_hash."""
    return token_hash(ids)[:SHORT]


def known_ids(ids: list[int | None]) -> list[int] | None:
    """The ids, or None when any is unknown (a server that streams text only)."""
    return None if any(i is None for i in ids) else [int(i) for i in ids]


def server_sha_matches(ids: list[int | None], server_sha: str | None) -> bool | None:
    """Does the server's token_sha equal our hash of the ids we received? None if unknowable."""
    ks = known_ids(ids)
    if server_sha is None or ks is None:
        return None
    return token_hash(ks)[:len(server_sha)] == server_sha


def reply_sha(ids: list[int | None], server_sha: str | None = None) -> str | None:
    """A reply's 12-hex hash: ours from the ids, else the server's, else None."""
    ks = known_ids(ids)
    return token_sha(ks) if ks else short(server_sha)


@dataclass
class Comparison:
    stream: str
    equal: bool | None  # None: cannot tell (unknown ids, or missing reply)
    detail: str = ""
    diverge_at: int | None = None  # unequal: the index of the first token that differs


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (the shorter one's length if one is a prefix of the
    other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_reply(name: str, ids: list[int | None], ref: list[int | None], prefix: bool,
                  server_sha: str | None = None, ref_sha: str | None = None) -> Comparison:
    """`prefix`: the reply may be shorter than the reference (a cancelled A) and is compared
    with the reference's prefix of its own length. Without ids, fall back to server hashes."""
    a, r = known_ids(ids), known_ids(ref)
    if a is None or r is None:
        if server_sha and ref_sha and not prefix:
            return Comparison(name, server_sha[:SHORT] == ref_sha[:SHORT], "by server token_sha")
        return Comparison(name, None, "no token ids")
    if not a:
        return Comparison(name, None, "empty reply")
    if prefix:
        n = min(len(a), len(r))
        at = first_divergence(a[:n], r[:n])
        return Comparison(name, at is None, f"on the reference's {n} tokens" if len(r) < len(a) else f"on {n} tokens",
                          at)
    return Comparison(name, a == r, f"{len(a)} tokens", first_divergence(a, r))


# ---- long-prompt ---------------------------------------------------------------------------

def reply_hashes(records: dict[str, StreamRecord]) -> dict[str, dict]:
    """Per stream: its length, our full hash, the server's token_sha and whether they agree."""
    out = {}
    for k, r in records.items():
        ids = known_ids(r.token_ids)
        out[k] = {"tokens": len(r.token_ids), "sha256": token_hash(ids) if ids is not None else None,
                  "server_sha": r.server_sha, "server_sha_matches": server_sha_matches(r.token_ids, r.server_sha)}
    return out


def long_prompt(data: dict) -> dict:
    """The A/B/C script's plan (`script`) with long-prompt's references: B and C against the first
    run where every stream is complete, A against the longest A among those runs (so each run's
    A is compared on its whole length); beside it the servers' token_sha against our own hashes
    and A's table hash over the common prefix."""
    runs = [r for r in data["runs"] if r["records"] and not any(rec.error for rec in r["records"].values())]
    out: dict = {"across_runs": {}, "refs": None, "vs_plain": {}, "server_sha": {"match": 0, "mismatch": 0, "absent": 0},
                 "a_prefix": None, "hashes": {}}
    if not runs:
        return out
    first = runs[0]
    longest = max(runs, key=lambda r: len(r["records"]["A"].token_ids))
    plan = script(data, {"A": longest["index"], "B": first["index"], "C": first["index"]})
    out.update(across_runs=plan["across_runs"], vs_plain=plan["vs_plain"],
               refs={"BC": first["index"], "A": longest["index"]})
    for r in data["runs"]:
        if not r["records"]:
            continue
        for h in r["hashes"].values():
            m = h["server_sha_matches"]
            out["server_sha"]["absent" if m is None else ("match" if m else "mismatch")] += 1
        if not any(h["server_sha"] for h in r["hashes"].values()):  # a server that sends none
            out["server_sha"].setdefault("none_from_runs", []).append(r["index"])
    a_lens = [len(r["records"]["A"].token_ids) for r in runs]
    plain = (data.get("plain") or {}).get("records") or {}
    if "A" in plain:
        a_lens.append(len(plain["A"].token_ids))
    n = min(a_lens)
    out["a_prefix"] = n
    for r in runs:
        ids = known_ids(r["records"]["A"].token_ids)
        out["hashes"][str(r["index"])] = {
            "A": short(token_hash(ids[:n])) if ids is not None and len(ids) >= n else None,
            "A_tokens": len(r["records"]["A"].token_ids),
            "B": short(r["hashes"]["B"]["sha256"]), "C": short(r["hashes"]["C"]["sha256"])}
    return out


# ---- scripts -------------------------------------------------------------------------------

def script(data: dict, refs: dict[str, int] | None = None) -> dict:
    """Each stream's reply in each run against its reference, and against the plain reference.

    A stream's reference is its reply in the first run where it finished (else the longest
    reply, when it was cancelled in every run), or the run `refs` names. A cancelled reply is compared on its own length
    with the reference's prefix, as long-prompt's A is; a reply that never got a token (cancelled
    during its prompt, failed, not sent) has nothing to compare and is counted apart. Across
    runs only when the prompts were the same (fresh servers, not --url)."""
    runs = [r for r in data["runs"] if r.get("records")]
    out: dict = {"across_runs": {}, "vs_plain": {}, "refs": {}, "hashes": {}, "no_reply": {}}
    if not runs:
        return out
    names = list(runs[0]["records"])

    def replied(rec: StreamRecord | None) -> bool:
        return rec is not None and not rec.error and bool(rec.token_ids)

    for n in names:
        got = [r for r in runs if replied(r["records"].get(n))]
        whole = [r for r in got if not r["records"][n].cancelled]
        ref = whole[0] if whole else max(got, key=lambda r: len(r["records"][n].token_ids), default=None)
        out["refs"][n] = (refs or {}).get(n, ref["index"] if ref else None)
    same_prompts = not data["settings"].get("url")
    plain = (data.get("plain") or {}).get("records") or {}
    for r in runs:
        across, vs_plain, key = [], [], str(r["index"])
        for n in names:
            rec = r["records"][n]
            if not replied(rec):
                out["no_reply"].setdefault(n, []).append(r["index"])
                continue
            ref = next((x for x in runs if x["index"] == out["refs"][n]), None)
            if same_prompts and ref is not None:
                f = ref["records"][n]
                c = compare_reply(n, rec.token_ids, f.token_ids, prefix=rec.cancelled,
                                  server_sha=rec.server_sha, ref_sha=f.server_sha)
                across.append(asdict(c))
            if n in plain and plain[n].token_ids:
                c = compare_reply(n, rec.token_ids, plain[n].token_ids, prefix=rec.cancelled,
                                  server_sha=rec.server_sha, ref_sha=plain[n].server_sha)
                vs_plain.append(asdict(c))
        if same_prompts:
            out["across_runs"][key] = across
        if plain:
            out["vs_plain"][key] = vs_plain
        out["hashes"][key] = {n: {"sha": reply_sha(rec.token_ids, rec.server_sha), "tokens": len(rec.token_ids),
                                  "cancelled": rec.cancelled}
                              for n, rec in r["records"].items() if replied(rec)}
    return out


# ---- sweep ---------------------------------------------------------------------------------

def prompt_key(cell: int, stream_i: int) -> str:
    """A sweep prompt's name: cell c's stream s gets the same prompt at every level and rep."""
    return f"c{cell}s{stream_i}"


@dataclass
class HashCheck:
    """Each prompt's reply across every batch of every run: equal, or flagged."""

    prompts: int
    replies: int
    equal: int  # replies equal to their prompt's reference reply
    reference: dict[str, str | None]  # prompt key -> the reference hash
    flagged: list[str]  # "c0s1: level 8 cell 0 rep 2 of new (run 3): abc != def"
    unknown: int = 0  # replies without token ids (a server that streams text only): not compared

    @property
    def ok(self) -> bool:
        return not self.flagged

    def summary(self) -> str:
        return f"{self.equal} of {self.replies} replies equal" + (
            f", {self.unknown} unknown (no token ids)" if self.unknown else "") + (
            "" if self.ok else f"; {len(self.flagged)} differ")

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def sweep(runs: list[tuple[str, list[dict]]], reference_run: int = 0) -> HashCheck:
    """Compare every sweep reply with its prompt's reference: the first reply to that prompt in
    `runs[reference_run]` (the first base run), else in any run. `runs`: (variant, batches)."""
    seen: dict[str, list[tuple[int, dict, str | None]]] = {}
    for ri, (_, batches) in enumerate(runs):
        for b in batches:
            for s, h in enumerate(b["hashes"]):
                seen.setdefault(prompt_key(b["cell"], s), []).append((ri, b, h))
    ref: dict[str, str | None] = {}
    for key, obs in seen.items():
        pref = [h for ri, _, h in obs if ri == reference_run and h] or [h for _, _, h in obs if h]
        ref[key] = pref[0] if pref else None
    equal, replies, unknown, flagged = 0, 0, 0, []
    for key in sorted(seen):
        for ri, b, h in seen[key]:
            replies += 1
            if h is None or ref[key] is None:
                unknown += 1  # no ids to hash: unknown, never "differ"
            elif h == ref[key]:
                equal += 1
            else:
                flagged.append(f"{key}: level {b['level']} cell {b['cell']} rep {b['rep']} of "
                               f"{runs[ri][0]} (run {ri + 1}): {h} != {ref[key]}")
    return HashCheck(len(seen), replies, equal, ref, flagged, unknown)


# ---- the gate ------------------------------------------------------------------------------

def gate_sides(runs: list[dict], accepted: bool) -> dict[str, list[dict]]:
    """The groups whose replies must agree: every run, or (a change of outputs acknowledged)
    base's runs and new's runs each among themselves."""
    if not accepted:
        return {"all runs": runs}
    return {side: [r for r in runs if r["variant"] == side] for side in ("base", "new")}


def gate(runs: list[dict], accepted: bool) -> dict:
    """The gate's hash checks: each side's sweep replies (per prompt) and long-prompt replies
    (B and C whole, A on the group's common prefix). Returns {"sweep": {group: HashCheck dict},
    "long_prompt": {"group:K": {equal, of}}, "differ": [reason, ...]}."""
    sweep_checks, lp, differ = {}, {}, []
    for label, group in gate_sides(runs, accepted).items():
        hc = sweep([(r["variant"], r["sweep"]["batches"]) for r in group])
        sweep_checks[label] = hc.to_dict()
        differ += [f"token hash differs ({label}): {f}" for f in hc.flagged[:5]]
        if len(hc.flagged) > 5:
            differ.append(f"token hash differs ({label}): … {len(hc.flagged) - 5} more")
        ids = {r["index"]: {k: known_ids(rec.token_ids) or [] for k, rec in r["long_prompt"]["records"].items()}
               for r in group}
        n_a = min((len(i["A"]) for i in ids.values()), default=0)
        for k in ("A", "B", "C"):
            hs = [(i, (token_sha(x["A"][:n_a]) if n_a else None) if k == "A" else (token_sha(x[k]) if x[k] else None))
                  for i, x in ids.items()]
            ref = hs[0][1] if hs else None
            bad = [f"run {i}: {h} != {ref}" for i, h in hs if h != ref or h is None]
            lp[f"{label}:{k}"] = {"equal": len(hs) - len(bad), "of": len(hs)}
            if bad:
                on = f", on its first {n_a} tokens" if k == "A" else ""
                differ.append(f"long-prompt {k}'s reply differs ({label}{on}): " + "; ".join(bad))
    return {"sweep": sweep_checks, "long_prompt": lp, "differ": differ}


# ---- load ----------------------------------------------------------------------------------

def load(data: dict) -> dict:
    """`tfbench load`'s replies: each request (level and item id) in each run against its reply
    in the first base run that has it (else the first run); and, with the plain reference,
    each reply against the plain reply to the same prompt (`pkey`: a later turn's prompt holds
    the run's own earlier replies, so it meets the plain one only when those were equal).
    Returns per variant {equal, of, unknown} across runs and vs plain, and the first differences."""
    runs = [r for r in data["runs"] if r.get("levels")]
    if data["settings"].get("url"):  # a server tfbench did not start gets fresh prompts each run: none compare
        return {"across_runs": {}, "vs_plain": {}, "flagged": [], "ok": True}
    base = data["settings"]["base"]
    ref: dict[tuple[str, str], str] = {}
    for r in sorted(runs, key=lambda r: (r["variant"] != base, r["index"])):
        for lv in r["levels"]:
            for q in lv["records"]:
                if q.sha and (lv["label"], q.id) not in ref:
                    ref[(lv["label"], q.id)] = q.sha
    plain = (data.get("plain") or {}).get("hashes") or {}
    across: dict[str, dict] = {}
    vs_plain: dict[str, dict] = {}
    flagged: list[str] = []
    for r in runs:
        a = across.setdefault(r["variant"], {"equal": 0, "of": 0, "unknown": 0})
        p = vs_plain.setdefault(r["variant"], {"equal": 0, "of": 0, "unknown": 0, "no_reference": 0})
        for lv in r["levels"]:
            for q in lv["records"]:
                if q.error and not q.gaps_us:
                    continue  # no reply: nothing to compare (the figures count it as failed)
                if q.sha is None:
                    a["unknown"] += 1
                    p["unknown"] += 1 if plain else 0
                    continue
                a["of"] += 1
                want = ref.get((lv["label"], q.id))
                if q.sha == want:
                    a["equal"] += 1
                elif len(flagged) < 20:
                    flagged.append(f"{lv['label']} {q.id}: run {r['index']} ({r['variant']}) {q.sha} != {want}")
                if plain:
                    got = plain.get(q.pkey)
                    if got is None:
                        p["no_reference"] += 1
                        continue
                    p["of"] += 1
                    if got == q.sha:
                        p["equal"] += 1
                    elif len(flagged) < 20:
                        flagged.append(f"{lv['label']} {q.id}: run {r['index']} ({r['variant']}) {q.sha} != "
                                       f"plain {got}")
    return {"across_runs": across, "vs_plain": vs_plain if plain else {}, "flagged": flagged,
            "ok": all(x["equal"] == x["of"] for x in across.values())
            and all(x["equal"] == x["of"] for x in (vs_plain.values() if plain else []))}


def gate_load(runs: list[dict], accepted: bool) -> tuple[dict, list[str]]:
    """The gate's --load replies: each request's hash equal across every run of a group (every
    run, or each side with a change of outputs acknowledged). ({group: {equal, of}}, reasons)."""
    out, differ = {}, []
    for label, group in gate_sides([r for r in runs if r.get("load")], accepted).items():
        ref: dict[str, str] = {}
        eq = of = 0
        for r in group:
            for q in r["load"]["records"]:
                if q.sha is None:
                    continue
                want = ref.setdefault(q.id, q.sha)
                of += 1
                if q.sha == want:
                    eq += 1
                elif len(differ) < 5:
                    differ.append(f"load reply differs ({label}): {q.id} in run {r['index']}: {q.sha} != {want}")
        out[label] = {"equal": eq, "of": of}
    return out, differ


# ---- variants that run other kernels -------------------------------------------------------

# tfengine flags that change a forward's arithmetic (its kernels, weights, precision or ranks): a
# reply may differ across them by a kernel's bits, not the schedule's. The others (--prefill-mode,
# --prefill-share, --parallel, ...) only schedule, and the engine keeps a reply's ids across them.
ARITHMETIC_FLAGS = ("--model", "--load-format", "--device", "--dtype", "--tensor-parallel", "--cpu-isa", "--threads",
                    "--cut-attention", "--mixed-low-tiles", "--seed")


def arithmetic_flags(args: list[str] | None) -> list[str]:
    """The arithmetic flags in an engine argv, each with its value ('--cut-attention tiles')."""
    out, args = [], list(args or [])
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in ARITHMETIC_FLAGS:
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            out.append(f"{name} {value}".strip())
    return out


def other_kernels(variants: list, base: str | None) -> dict[str, list[str]]:
    """Each launched variant's arithmetic flags that the base's (and so the plain reference's) lack."""
    launched = [v for v in variants or [] if v.url is None and v.command is None]
    ref = next((v for v in launched if v.name == base), launched[0] if launched else None)
    if ref is None:
        return {}
    mine = set(arithmetic_flags(ref.args))
    return {v.name: extra for v in launched if (extra := [f for f in arithmetic_flags(v.args) if f not in mine])}


def other_kernels_line(variants: list, base: str | None) -> str | None:
    """A receipt's line naming variants whose replies may differ from the base's and the plain
    reference's by their kernels' bits (None: every variant runs the base's arithmetic)."""
    diff = other_kernels(variants, base)
    if not diff:
        return None
    named = "; ".join(f"{name} runs `{' '.join(flags)}`" for name, flags in diff.items())
    return (f"- Other arithmetic: {named}, which the base ({base}) and the plain reference do not, so a reply of "
            "theirs may differ by those kernels' bits, not by the schedule. To compare schedules alone, give "
            "every server the flags (`--engine-arg`).")
