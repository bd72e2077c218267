# Sourced (not run) by the GPU scripts whose NVSHMEM PEs share one GPU under
# MPS (gpu-overlap.sh, gpu-fused-put.sh, gpu-moe-fused.sh, gpu-pending.sh):
# their summary rows, the summary at exit, and MPS's start, restart and quit. ROW_FMT, set before sourcing, is
# the printf format of a row (name, status, detail).
declare -a rows
row() { rows+=("$(printf "${ROW_FMT:-%-52s %-6s %s}" "$1" "$2" "$3")"); }
mps_quit() { [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; sleep 1; }
# A PE killed while its peers wait (a failed check: NVSHMEM cannot abort)
# can leave the MPS server unable to make contexts; start it anew.
mps_restart() { mps_quit; nvidia-cuda-mps-control -d && row "MPS restarted" ok "after a failure"; }
# mps_summary_on_exit TITLE: at exit, whatever happens, MPS is quit and
# "== TITLE" and the rows are printed.
mps_summary_on_exit() {
  MPS_SUMMARY_TITLE=$1
  trap 'mps_quit; echo; echo "== $MPS_SUMMARY_TITLE"; printf "%s\n" "${rows[@]}"' EXIT
}
# mps_start starts the daemon with its own pipe and log folders (each PE's
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is set by the tests' launcher) and adds
# a row saying how it went; it fails when the daemon does not start.
mps_start() {
  PATH=$PATH:/usr/local/nvidia/bin
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  if nvidia-cuda-mps-control -d; then row "MPS" ok "pipe $CUDA_MPS_PIPE_DIRECTORY"; else row "MPS" FAIL "nvidia-cuda-mps-control -d"; return 1; fi
}
