# Sourced (not run), after scripts/gpu-env.sh, by the GPU scripts whose
# NVSHMEM PEs or PyTorch ranks share one GPU under MPS: MPS's start, restart
# and quit (gpu-env.sh's summary_on_exit quits it at exit, whatever
# happens). Each PE's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is set by the tests'
# launcher (internal/testing/pes) or by the script.

# mps_start starts the daemon with its own pipe and log folders and adds a
# row saying how it went; it fails (a FAIL row) when the daemon does not
# start.
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  if nvidia-cuda-mps-control -d; then
    row "MPS" ok "pipe $CUDA_MPS_PIPE_DIRECTORY"
  else
    row "MPS" FAIL "nvidia-cuda-mps-control -d"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
  fi
}

# mps_quit stops the daemon this script started, if any.
mps_quit() {
  if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    echo quit | timeout 20 nvidia-cuda-mps-control > /dev/null 2>&1
    sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}

# mps_restart starts MPS anew: a PE killed while its peers wait (a failed
# check: NVSHMEM cannot abort) can leave the server unable to make contexts.
mps_restart() { mps_quit; mps_start; }
