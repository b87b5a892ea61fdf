"""Do replies keep their ids between --parallel 1 and --parallel 4? Two fresh cpu-preset servers,
two prompts, greedy and sampled (T=1.0, the harness's per-role seeds), 80 tokens each; prints
where each pair first differs. Extra arguments go to both servers (e.g. --dtype float32).

    PYTHONPATH=. python scripts/parallel_invariance_check.py [--dtype float32]

On 2026-11-30 (engine d04d58a, bf16 default on this CPU): greedy A differed from token 64, C from
22; sampled A from 7, C from 13. With --dtype float32 all four were equal.
"""
import asyncio, sys
from pathlib import Path
from tensorfold_bench.client.play import play_alone
from tensorfold_bench.client.sampling import Sampling, GREEDY
from tensorfold_bench.client.stream import Request
from tensorfold_bench.servers.launcher import launch
from tensorfold_bench.workload.ids import prompt_ids

extra = sys.argv[1:]
out = {}
for par in ("1", "4"):
    with launch(["--model", "cpu", "--seed", "1234", "--parallel", par, "--max-model-len", "1024", *extra], Path(f"parallel{par}.log")) as srv:
        res = {}
        for name, s in (("greedy", GREEDY), ("t1", Sampling(1.0, 1234))):
            for role in ("A", "C"):
                req = s.apply(Request(role, prompt_ids(1234, role, 34, 512), max_tokens=80), role)
                rec = asyncio.run(play_alone(srv.url, req, "cpu"))
                res[(name, role)] = rec.token_ids
        out[par] = res
for k in out["1"]:
    a, b = out["1"][k], out["4"][k]
    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    print(extra, k, "equal" if a == b else f"first diff at {first}")
