#!/usr/bin/env bash
# Runs on the GPU machine (one H200): our GEMM engine when processes share
# the GPU under MPS. Measured (docs/measurements/2026-12-02.md): 0.99 of
# cuBLASLt alone, 0.47–0.49 with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 whether
# one client ran or two, when the device already reported the client's 66 SMs
# and the engine applied the 50 % again (grid 33). The engine now takes the context's SM limit
# (cuCtxGetExecAffinity) or the device's count; BenchmarkEngineGrid sweeps
# the grid around it.
#   E1 one process, no MPS: the grid sweep
#   E2 one client at 50 %, alone: the grid sweep (where the wave breaks)
#   E3 two clients at 50 %, together: the automatic grid
# Each step has its own timeout (STEP_TIMEOUT, 60 s).
# Needs build/tensor_cudabackend.test and the kernels image (built if absent).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PATH=$PATH:/usr/local/nvidia/bin
export ASYNCTP_KERNELS=${ASYNCTP_KERNELS:-$PWD/build/asynctp_kernels.fatbin}
[ -f "$ASYNCTP_KERNELS" ] || bash cuda/kernels/build.sh > /dev/null
B=build/tensor_cudabackend.test
T=${STEP_TIMEOUT:-60}
eb() { # benchmark regexp
  timeout "$T" "$B" -test.v -test.run '^$' -test.bench "$1" -test.benchtime 50x 2>&1 |
    grep -E '^Benchmark|engine grid:' | sed -E 's/^BenchmarkEngineGrid\/?//; s/-[0-9]+ +[0-9]+ +[0-9]+ ns\/op//'
  [ "${PIPESTATUS[0]}" = 124 ] && echo "timed out after $T s"
}
mps_on() { export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d); nvidia-cuda-mps-control -d; }
mps_off() { echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; sleep 1; }
trap mps_off EXIT
echo "== E1 one process, no MPS"; eb 'EngineGrid'
mps_on
echo "== E2 one client at 50 %, alone"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb 'EngineGrid'
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb 'EngineGrid/grid=auto' > /tmp/e3a) & (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb 'EngineGrid/grid=auto' > /tmp/e3b) & wait
echo "== E3 two clients at 50 %, together"; cat /tmp/e3a /tmp/e3b
