#!/bin/bash
# One call on the device's host (16 cores, the GPU unused, about 3 minutes), after
# scripts/host_scaling.sh: why its misses happened.
#  A. bursts of 1,024 with the synthetic server in 8 processes (in 4, its reads of 1,024 requests
#     written at once spread over 15 ms), from the sweep's 4 client processes and from one;
#  B. open loops at 2,000 req/s a client process, the server in 6: one process alone, 2 processes
#     for 3 s and for 1.5 s (half the requests a process to prepare), and 4,000 / 8,000 req/s from
#     3 and 6 processes (about 1,330 a process, what the automatic rule picks); every send's
#     lateness kept (--sends), and each run's start spare;
#  vmstat through it all (steal time, run queue), the CPU and any cgroup CPU quota first.
# Predictions (written before the call): receipts/calibrate/predictions-16cpu-limits.md.
# Usage: bash scripts/host_client_limits.sh   (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
nproc; uptime; lscpu | grep -E 'Model name|Thread|Core|Socket|MHz|Hypervisor|NUMA node\(s\)'
cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null
vmstat -n 1 > "$OUT/vmstat.txt" 2>&1 &
VM=$!
timeout 60 python3 -m tools.client_edges --levels 1024 --rates '' --burst-server-workers 8 --out "$OUT/bursts8.json"
timeout 60 python3 -m tools.client_edges --levels 1024 --rates '' --burst-server-workers 8 --burst-procs 1 --out "$OUT/bursts8-1proc.json"
P="python3 -m tools.open_loop_probe --server-workers 6 --sends $OUT/sends"
timeout 60 $P --rates 2000 --procs 1 --duration 3 --out "$OUT/one-2000.json"
timeout 60 $P --rates 4000 --procs 2 --duration 3 --out "$OUT/two-4000-3s.json"
timeout 60 $P --rates 4000 --procs 2 --duration 1.5 --sends "$OUT/sends-1.5s" --out "$OUT/two-4000-1.5s.json"
timeout 90 $P --rates 4000,8000 --procs 3,6 --duration 3 --out "$OUT/spread.json"
kill $VM; uptime
