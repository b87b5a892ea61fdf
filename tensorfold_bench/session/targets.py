"""What each variant runs against: tfengine with the shared flags, a command (any server, its
argv filled in here), or a running server (--url, reachable and named before any run)."""
from __future__ import annotations

import os
from dataclasses import replace

from tensorfold_bench.errors import FlagError
from tensorfold_bench.servers.identity import identify
from tensorfold_bench.servers.launcher import check_reachable
from tensorfold_bench.session.variants import Variant, order_for, parse_order, select_variants, url_variants


def select(url: list[str] | str | None, share: str | None, variants_file, base_ref: str | None,
            new_ref: str | None, order: str | None, aa: bool,
            budgets: str | None = None, sms: str | None = None) -> tuple[list[Variant], list[str], str | None]:
    """(variants, run order, the --url line): launched variants from --share/--variants/--base/
    --new, or with --url the running servers, each reachable (else one line, exit 2), named as
    given (NAME=URL) or by the server itself, in the order given, once each unless --order."""
    if not url:
        vs = select_variants(share, str(variants_file) if variants_file else None, base_ref, new_ref, budgets=budgets,
                             sms=sms)
        return (*order_for(vs, order, aa), None)
    for flag, v in (("--share", share), ("--mixed", budgets), ("--split", sms), ("--variants", variants_file), ("--base", base_ref), ("--new", new_ref),
                    ("--aa", aa or None)):
        if v is not None:
            raise FlagError("--url", f"measures running servers as they are; {flag} needs servers tfbench launches")
    vs = url_variants([url] if isinstance(url, str) else list(url), lambda u: identify(check_reachable(u)).name)
    vs = [replace(v, url=check_reachable(v.url)) for v in vs]
    names = parse_order(order, vs) if order is not None else [v.name for v in vs]
    return vs, names, ", ".join(v.url for v in vs)


def shared_fields(engine) -> dict[str, str]:
    """What a command variant may say besides {host} and {port}: the shared flags' values."""
    return {"{model}": engine.model, "{dtype}": engine.dtype or "auto",
            "{max_model_len}": str(engine.max_model_len or "")}


def command_argv(variant: Variant, engine) -> list[str]:
    """A command variant's argv with $VARS expanded from tfbench's environment (an unset one is a
    flag error) and the shared fields filled in ({host}, {port}: the launcher)."""
    out = []
    for a in variant.command or []:
        a = os.path.expandvars(a)
        if "$" in a:
            raise FlagError("--variants", f"variant {variant.name}'s command says {a!r}: set that variable")
        for k, v in shared_fields(engine).items():
            if k in a and not v:
                raise FlagError("--max-model-len", f"variant {variant.name}'s command says {k}: give it")
            a = a.replace(k, v)
        out.append(a)
    return out
