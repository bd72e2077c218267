#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repository root, with build/
# carried from the dev machine (bash scripts/build-gpu-artifacts.sh; the
# kernels image and libasynctp_nvshmem.so built there by the other GPU
# scripts, or carried): compute-sanitizer over the fused kernels on NVSHMEM
# PEs that share the GPU under MPS, each PE under its own tool process —
# $ASYNCTP_PE_WRAP (comm/commtest) puts the tool in front of every child PE,
# as `mpirun -np 2 compute-sanitizer ./app` would; a tool around the whole
# test binary instead (--target-processes all) never got the PEs through
# NVSHMEM's start-up here. Steps (each within the time left of BUDGET s):
#   memcheck, racecheck and synccheck over the fused TP site suite (pull
#   and put transfers), memcheck over its determinism test (10 runs) and
#   over the fused MoE expert path (TestFusedGPU).
# Each PE's tool log and output stay in $OUT/sanitize-pes/<step>/.
# PES (default 2) PEs per run; STEPS (a regexp, default all) the steps to run,
# by name (e.g. STEPS=moe-fused).
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
. scripts/mps.sh
OUT=${OUT:-build/out}/sanitize-pes
PES=${PES:-2}
mkdir -p "$OUT"
ROW_FMT='%-44s %-8s %s'
summary_on_exit "summary (logs in $OUT)"
need "$ASYNCTP_KERNELS" "$ASYNCTP_LIBNVSHMEM" build/overlap_peercopy.test build/parallel_ep_peerep.test
if kernels_stale; then
  row "$ASYNCTP_KERNELS" FAIL "older than a kernel source: rebuild it first (bash cuda/kernels/build.sh)"; exit 1
fi
end=$(( $(date +%s) + ${BUDGET:-470} ))
san() { # step tool test-binary test-regexp [env...]
  local name=$1 tool=$2 bin=$3 re=$4; shift 4
  [[ "$name" =~ ${STEPS:-.} ]] || return 0
  local left=$(( end - $(date +%s) ))
  if [ $left -lt 40 ]; then row "$name" NOT-RUN "no time left of the budget"; return; fi
  local lim=$(( left < 200 ? left : 200 )) d="$OUT/$name" t0
  mkdir -p "$d"; t0=$(date +%s)
  mps_start > /dev/null || return
  env ASYNCTP_OVERLAP_PES="$PES" ASYNCTP_OVERLAP_TIMEOUT=$((lim-10))s ASYNCTP_PE_LOG_DIR="$d" \
    ASYNCTP_PE_WRAP="compute-sanitizer --tool $tool --error-exitcode 3 --log-file $d/$tool-rank{rank}.txt" "$@" \
    timeout -k 5 $lim "$bin" -test.v -test.count=1 -test.timeout=${lim}s -test.run "$re" > "$d/test.log" 2>&1
  local rc=$?
  local f summaries=""
  for f in "$d"/$tool-rank*.txt; do [ -f "$f" ] && summaries="$summaries $(basename "$f" .txt): $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tr '\n' ' ')"; done
  if [ $rc -eq 0 ]; then
    row "$name ($tool, $PES PEs)" ok "$(( $(date +%s) - t0 )) s;$summaries"
  else
    row "$name ($tool, $PES PEs)" FAIL "exit $rc, $(( $(date +%s) - t0 )) s, see $name/;$summaries"
    grep -hE 'FAIL|rank [0-9]+: ' "$d/test.log" | head -5
    grep -hE 'Invalid|Race|hazard|Barrier|  at ' "$d"/$tool-rank*.txt 2> /dev/null | head -10
  fi
  mps_quit
}
san suite-memcheck memcheck build/overlap_peercopy.test '^TestSuiteGPU$' ASYNCTP_OVERLAP_STRATEGIES=fused-pull,fused-put
san suite-racecheck racecheck build/overlap_peercopy.test '^TestSuiteGPU$' ASYNCTP_OVERLAP_STRATEGIES=fused-pull,fused-put
san suite-synccheck synccheck build/overlap_peercopy.test '^TestSuiteGPU$' ASYNCTP_OVERLAP_STRATEGIES=fused-pull,fused-put
san determinism-memcheck memcheck build/overlap_peercopy.test '^TestFusedDeterminismGPU$'
san moe-fused-memcheck memcheck build/parallel_ep_peerep.test '^TestFusedGPU$'
