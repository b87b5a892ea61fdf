#!/bin/bash
# One call on the device's host (16 cores; the GPU is not used, ~1 minute): the open loop at 2,000
# req/s against the synthetic server in one process and in four (--server-workers), same host,
# same session.
# Predictions (written before the call): with 1 server process the server's reads bunch as on
# 7 Dec 08:35 (CV 1.2, KS 0.2, the client's own sends KS under 0.1); with 4 the reads follow the
# client's sends: CV within 1 +- 0.15 and KS under 0.1 (the Poisson target, met on a host
# with cores to spare), TTFT p50 within 1 ms of the truth.
# Usage: bash scripts/gpu_host_edges.sh   (files under $OUT: edges-w1.json, edges-w4.json, console.txt)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
for w in 4 1; do
  timeout 100 python3 -m tools.client_edges --levels '' --rates 2000 --server-workers $w --out "$OUT/edges-w$w.json"
done
