#!/usr/bin/env bash
# Builds the kernels image build/asynctp_kernels.fatbin from asynctp_kernels.cu
# (which includes every kernel file), for Hopper: sm_90a machine code plus
# compute_90 PTX as a fallback the driver can JIT. Needs nvcc ≥ 12 (the GPU
# machine has 13.0). Run from anywhere:
#
#   bash cuda/kernels/build.sh            # → build/asynctp_kernels.fatbin
#
# Environment:
#   NVCC        the compiler (default: nvcc on PATH, else $CUDA_HOME/bin/nvcc)
#   OUT_DIR     where the image goes (default: <repo>/build)
#   GENCODE     the targets (default: sm_90a code + compute_90 PTX); e.g.
#               GENCODE="-gencode arch=compute_80,code=sm_80" to compile-check
#               with an older toolkit
#   NVCC_FLAGS  extra flags (e.g. "-Xptxas -v" for registers and spills,
#               "-lineinfo" for ncu source views; nvcc 11.8 ptxas crashes on
#               -lineinfo for sm_90, so it is not the default)
#
# The kernels with NVSHMEM device calls are not in this image: they build
# into build/libasynctp_nvshmem.so (cuda/nvshmem/build.sh, device-linked
# with libnvshmem_device.a). Exit status non-zero when nvcc is missing or
# fails (scripts/README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT_DIR:-$root/build}
nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  if command -v nvcc >/dev/null 2>&1; then nvcc=nvcc
  elif [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
  else echo "build.sh: nvcc not found (set NVCC or CUDA_HOME)" >&2; exit 1; fi
fi
gencode=${GENCODE:-"-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90"}
mkdir -p "$out"
set -x
# shellcheck disable=SC2086
"$nvcc" -O3 -std=c++17 $gencode ${NVCC_FLAGS:-} -fatbin \
  -o "$out/asynctp_kernels.fatbin" "$here/asynctp_kernels.cu"
