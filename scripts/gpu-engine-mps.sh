#!/usr/bin/env bash
# Runs on the GPU machine (one H200): why our GEMM engine runs at about half
# of cuBLASLt's speed when processes share the GPU under MPS (BENCHMARKS.md,
# "Session of 2026-12-02": 0.99 alone, 0.49 with two clients at 50 %).
# Each experiment has its own timeout (the 2026-12-02 run of E3 hung and
# spent the session's device time), and MPS is restarted after a timeout.
#   E1 one process, no MPS            E2 two clients, 50 % each (grid 66)
#   E3 one client at 50 %, alone      E4 two clients, 50 %, one at a time
#   E5 two clients, no limit (grid 132 each: the one that hung)
# Needs build/tensor_cudabackend.test and the kernels image (built if absent).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PATH=$PATH:/usr/local/nvidia/bin
export ASYNCTP_KERNELS=${ASYNCTP_KERNELS:-$PWD/build/asynctp_kernels.fatbin}
[ -f "$ASYNCTP_KERNELS" ] || bash cuda/kernels/build.sh > /dev/null
B=build/tensor_cudabackend.test
R=${BENCH:-Engine/tp/8192x6144x12288/nt}
T=${STEP_TIMEOUT:-40}
eb() { timeout "$T" "$B" -test.run '^$' -test.bench "$R" -test.benchtime 100x 2>&1 | grep -E '^Benchmark' | awk '{print $5, $6, $7, $8, $9, $10}' || echo "timed out after $T s"; }
mps_on() { export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d); nvidia-cuda-mps-control -d; }
mps_off() { echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; sleep 1; }
trap mps_off EXIT
echo "E1 one process, no MPS: $(eb)"
mps_on
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb > /tmp/e2a) & (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb > /tmp/e2b) & wait
echo "E2 two clients at 50 %: $(cat /tmp/e2a) | $(cat /tmp/e2b)"
echo "E3 one client at 50 %, alone: $(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb)"
echo "E4 two clients at 50 %, one after the other: $(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb) | $(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb)"
mps_off; mps_on
(eb > /tmp/e5a) & (eb > /tmp/e5b) & wait
echo "E5 two clients without a limit: $(cat /tmp/e5a) | $(cat /tmp/e5b)"
