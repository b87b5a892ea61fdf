#!/bin/bash
# The simulator against the GPU receipts of one device call, figure by figure (no GPU needed):
#   bash scripts/sim_check.sh PROFILE LONG_PROMPT_RECEIPT... [-- SWEEP_RECEIPT LOAD_RECEIPT] > OUT.md
# Long-prompt: each run's twin on PROFILE (tensorfold_bench.calibrate.sim_error --profile). Sweep and
# load: the same command in virtual time (--sim PROFILE), compared with `tfbench compare` (A: real,
# B: simulated). The sweep and load flags below are scripts/gpu_sweep_load.sh's.
set -eu
profile=$1; shift
lp=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do lp+=("$1"); shift; done
[ $# -gt 0 ] && shift
sweep=${1:-} load=${2:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf -- "- name: whole\n  flags: --prefill-mode whole\n- name: split sms=40\n  flags: --prefill-mode split --decode-sms 40\n" > "$tmp/v.yaml"
echo "# The simulator against real runs on one card (every B figure below is simulated)"
echo
echo "Profile: \`$profile\`. Made by \`bash scripts/sim_check.sh $profile ${lp[*]}${sweep:+ -- $sweep $load}\`."
echo
echo "## Long-prompt: each run's twin"
echo
python -m tensorfold_bench.calibrate.sim_error --profile "$profile" "${lp[@]}"
[ -n "$sweep" ] || exit 0
python -m tensorfold_bench sweep --sim "$profile" --levels 1,2,4,8,16,32,64 --tokens 256 --cells 2 --reps 1 --parallel 64 \
  --variants "$tmp/v.yaml" --order "whole,split sms=40,whole" --out "$tmp/sw" > /dev/null
python -m tensorfold_bench load --sim "$profile" --parallel 8 --rate 8 --duration 12 --input-len 256 --output-len 32 \
  --inject 32000@4 --slo ttft=300ms,tpot=30ms,e2e=2s --variants "$tmp/v.yaml" --order "whole,split sms=40,whole" --out "$tmp/ld" > /dev/null
echo
echo "## Sweep: real (A) against simulated (B)"
echo
python -m tensorfold_bench compare "$sweep" "$tmp"/sw/*.json.gz | sed -n '/^| figure/,$p'
echo
echo "## Load: real (A) against simulated (B)"
echo
python -m tensorfold_bench compare "$load" "$tmp"/ld/*.json.gz | sed -n '/^| figure/,$p'
