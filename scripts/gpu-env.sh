# Sourced (not run) by every GPU script, first thing after it changes to the
# repository root. It gives them one convention (scripts/README.md):
#
#   exit status 0    every step passed
#   exit status 1    a step failed, or something the script needs is
#                    missing: the summary's FAIL rows, or one line, say which
#   exit status 77   nothing was run: this machine has no GPU (one line on
#                    stderr); a person or CI tells it from success and from
#                    a failure by the status alone
#
# and what every command on a GPU machine keeps: no NVLink multicast for
# NCCL, NVSHMEM or PyTorch's symmetric memory (it can take a shared host's
# GPUs out of service), and the default paths of the kernels image and
# libasynctp_nvshmem.so in build/ (a value already set is kept).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export ASYNCTP_KERNELS=${ASYNCTP_KERNELS:-$PWD/build/asynctp_kernels.fatbin}
export ASYNCTP_LIBNVSHMEM=${ASYNCTP_LIBNVSHMEM:-$PWD/build/libasynctp_nvshmem.so}
export PATH=$PATH:/usr/local/nvidia/bin

# The status of a script that found no GPU.
NO_GPU_STATUS=77

# require_gpu ends the script with NO_GPU_STATUS and one line on stderr
# when nvidia-smi (ASYNCTP_NVIDIA_SMI: another path, e.g. to test this very
# path on a machine that has a GPU) is missing or lists no GPU. It runs
# when this file is sourced, before the script builds or runs anything.
require_gpu() {
  local smi=${ASYNCTP_NVIDIA_SMI:-nvidia-smi}
  if ! command -v "$smi" > /dev/null 2>&1 || ! "$smi" -L 2> /dev/null | grep -q '^GPU '; then
    echo "$(basename "$0"): no GPU found ($smi lists none): nothing was run (exit status $NO_GPU_STATUS)" >&2
    exit "$NO_GPU_STATUS"
  fi
}
require_gpu

# kernels_stale: true when the kernels image is missing or older than a
# kernel source (the scripts then rebuild it with cuda/kernels/build.sh).
kernels_stale() {
  [ ! -f "$ASYNCTP_KERNELS" ] || [ -n "$(find cuda/kernels -name '*.cu*' -newer "$ASYNCTP_KERNELS" 2> /dev/null | head -1)" ]
}

# row NAME STATUS DETAIL adds a line to the summary. STATUS FAIL, TIMEOUT
# or NOT-RUN (a step the budget left no time for) marks the script failed;
# ok, skipped (by the caller's choice), an empty or any other word is
# information. ROW_FMT, set before the first row, is the printf format of a
# row.
declare -a rows
script_failed=0
row() {
  case "$2" in FAIL | TIMEOUT | NOT-RUN) script_failed=1 ;; esac
  rows+=("$(printf "${ROW_FMT:-%-52s %-7s %s}" "$1" "$2" "$3")")
}

# summary_on_exit TITLE: at exit, whatever happens, MPS is quit when
# scripts/mps.sh started it, the script's before_summary function runs if it
# has one, "== TITLE" and the rows are printed, and the exit status is 1
# when a row failed (an explicit non-zero exit keeps its own status).
summary_on_exit() {
  SUMMARY_TITLE=$1
  trap _on_exit EXIT
}
_on_exit() {
  local status=$?
  if declare -F mps_quit > /dev/null; then mps_quit; fi
  if declare -F before_summary > /dev/null; then before_summary; fi
  echo
  echo "== $SUMMARY_TITLE"
  [ ${#rows[@]} -eq 0 ] || printf '%s\n' "${rows[@]}"
  if [ "$status" -eq 0 ] && [ "$script_failed" -ne 0 ]; then status=1; fi
  exit "$status"
}

# need FILE...: a row naming how to make it and exit status 1 for the first
# file that is missing (the Go binaries come from
# scripts/build-gpu-artifacts.sh on the dev machine, the CUDA images from
# nvcc here).
need() {
  local f how
  for f in "$@"; do
    [ -e "$f" ] && continue
    case "$f" in
      *.fatbin) how="bash cuda/kernels/build.sh (nvcc, on this machine)" ;;
      *.so) how="bash cuda/nvshmem/build.sh (nvcc and NVSHMEM, on this machine)" ;;
      *) how="bash scripts/build-gpu-artifacts.sh on the dev machine, then carry build/" ;;
    esac
    row "$f" FAIL "missing: $how"
    exit 1
  done
}
