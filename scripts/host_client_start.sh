#!/bin/bash
# One call on the device's host (16 cores, the GPU unused, under a minute), after
# scripts/host_client_limits.sh: its late sends fell in each run's first 0.25 s. Three runs at
# 2,000 req/s from one client process in one interpreter (a fresh event loop each), and two at
# 4,000 from two fresh worker processes each, the synthetic server in 6 processes; the latest
# send of every 25 ms of the first half second.
# Predictions (written before the call): receipts/calibrate/predictions-16cpu-start.md.
# Usage: bash scripts/host_client_start.sh   (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
uptime
P="python3 -m tools.open_loop_probe --server-workers 6 --duration 1.5"
timeout 60 $P --rates 2000 --procs 1,1,1 --out "$OUT/one-2000.json"
timeout 60 $P --rates 4000 --procs 2,2 --out "$OUT/two-4000.json"
uptime
