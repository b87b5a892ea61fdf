#!/bin/bash
# One call on the device's host (16 cores; the GPU is not used, about 3 minutes): the client's edges
# and its multi-process scaling, against the synthetic server on the same host.
#  A. bursts of 256 and 1,024 streams (200 tokens, first 20 ms after the read, then every 10 ms),
#     the server in 4 processes, the client by the sweep's rule (1 process at 256, 4 at 1,024),
#     and 1,024 again from one process, for the error processes save;
#  B. open loops at 2,000 / 4,000 / 8,000 req/s, the server in 4 processes, the client processes by
#     `tfbench load`'s automatic rule;
#  C. the scaling curve: 4,000 / 8,000 / 16,000 req/s from 1, 2, 4 and 8 client processes, the
#     server in 6.
# Predictions (written before the call): receipts/calibrate/predictions-16cpu-scaling.md.
# Usage: bash scripts/host_scaling.sh   (files under $OUT: bursts.json, bursts-1proc.json, loads.json, scaling.json,
#        console.txt)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
nproc; uptime
timeout 120 python3 -m tools.client_edges --levels 256,1024 --rates '' --burst-server-workers 4 --out "$OUT/bursts.json"
timeout 60 python3 -m tools.client_edges --levels 1024 --rates '' --burst-server-workers 4 --burst-procs 1 --out "$OUT/bursts-1proc.json"
timeout 120 python3 -m tools.client_edges --levels '' --rates 2000,4000,8000 --server-workers 4 --duration 3 --out "$OUT/loads.json"
timeout 300 python3 -m tools.open_loop_probe --rates 4000,8000,16000 --procs 1,2,4,8 --server-workers 6 --duration 3 --out "$OUT/scaling.json"
uptime
