#!/usr/bin/env bash
# Syntax- and type-checks the library's sources with whatever nvcc is on
# PATH, against the CHECK-ONLY stand-ins for NVSHMEM's headers in stub/ (for
# a machine without NVSHMEM, e.g. the dev machine's CUDA 11.8). It compiles
# to relocatable objects in a temporary folder and links nothing; the real
# build is ../build.sh on the GPU machine.
#
#   bash cuda/nvshmem/check/check.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
arch=${CHECK_ARCH:-sm_90}
for defs in "-DATP_NV_HAVE_BF16_REDUCE -DATP_NV_HAVE_REDUCESCATTER" ""; do
  for f in atp_nvshmem.cu atp_exchange.cu; do
    # shellcheck disable=SC2086
    nvcc -std=c++17 -O1 -rdc=true -arch="$arch" -Xcompiler -fPIC,-Wall $defs \
      -I"$here/stub" -I"$src" -c "$src/$f" -o "$tmp/${f%.cu}.o"
  done
done
# The header must also be plain C for the cgo loader.
gcc -std=c11 -Wall -Wextra -fsyntax-only -x c "$src/atp_nvshmem.h"
echo "check.sh: atp_nvshmem.cu and atp_exchange.cu compile against the stubs ($arch, $(nvcc --version | tail -1))"
