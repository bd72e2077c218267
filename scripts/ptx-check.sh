#!/usr/bin/env bash
# Checks that a kernel refactor keeps the generated code: builds the
# compute_90 PTX of the kernels image at a git revision (default HEAD) and of
# the working tree (or of a second revision), with every sm_90a-only body
# forced on (ATP_GEMM90_BODY, ATP_WG_BODY), and compares them function by
# function (scripts/ptx-compare.py). Needs nvcc ≥ 11.8 (on the dev machine:
# Debian's nvidia-cuda-toolkit, from the non-free component); PTX only, so
# no GPU. Exit status 1 when a function differs. Without nvcc,
# scripts/kernel-text-check.py checks a refactor that only moves code.
#
#   bash scripts/ptx-check.sh [REV [REV2]]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
rev2=${2:-}
nvcc=${NVCC:-nvcc}
command -v "$nvcc" >/dev/null || { echo "ptx-check.sh: $nvcc not found (set NVCC)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$rev" cuda/kernels | tar -x -C "$tmp"
ptx() { (cd "$1" && "$nvcc" -arch=compute_90 -ptx -DATP_GEMM90_BODY=1 -DATP_WG_BODY=1 -std=c++17 \
  -o "$2" asynctp_kernels.cu 2>"$2.log") || { echo "nvcc failed in $1:"; grep -i error "$2.log" | head; exit 2; }; }
ptx "$tmp/cuda/kernels" "$tmp/before.ptx"
after=cuda/kernels
if [ -n "$rev2" ]; then
  mkdir -p "$tmp/rev2"
  git archive "$rev2" cuda/kernels | tar -x -C "$tmp/rev2"
  after=$tmp/rev2/cuda/kernels
fi
ptx "$after" "$tmp/after.ptx"
python3 scripts/ptx-compare.py "$tmp/before.ptx" "$tmp/after.ptx"
