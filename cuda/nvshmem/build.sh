#!/usr/bin/env bash
# Builds build/libasynctp_nvshmem.so, the native half of comm/nvshmem, on a
# machine with nvcc and NVSHMEM 3.x (the GPU machine: CUDA 13.0, NVSHMEM from
# PyTorch's nvidia-nvshmem wheel). Run from anywhere:
#
#   bash cuda/nvshmem/build.sh            # → build/libasynctp_nvshmem.so
#
# Steps (see README.md for why a shared library):
#   1. find NVSHMEM: $NVSHMEM_HOME, else <python3's nvidia package>/nvshmem;
#      it needs include/nvshmem.h, lib/libnvshmem_device.a and
#      lib/libnvshmem_host.so.3 (or .so);
#   2. probe the headers for bfloat16 reductions and reducescatter (they are
#      not in every 3.x) and define ATP_NV_HAVE_BF16_REDUCE /
#      ATP_NV_HAVE_REDUCESCATTER accordingly;
#   3. compile atp_nvshmem.cu and atp_exchange.cu with -rdc=true -fPIC,
#      device-link them with libnvshmem_device.a (nvcc -dlink), and link the
#      shared library with the host compiler against libnvshmem_device.a (the
#      host part of nvshmem_init), libnvshmem_host.so.3 (with an rpath to its
#      folder) and the static CUDA runtime, refusing undefined symbols and
#      exporting none of the static libraries' (only atp_nv_*); if
#      that link fails, nvcc -shared links instead (device link included);
#   4. list the exported atp_nv_* entry points and the resolved libraries.
#
# The target is sm_90a (-gencode arch=compute_90a,code=sm_90a); if the
# device link fails for it (libnvshmem_device.a may hold only sm_90 code), the
# build retries with sm_90 and says so.
#
# Environment:
#   NVCC          the compiler (default: nvcc on PATH, else $CUDA_HOME/bin/nvcc)
#   NVSHMEM_HOME  NVSHMEM's folder (default: found through python3)
#   PYTHON        the Python that has the wheel (default python3)
#   OUT_DIR       where the library goes (default: <repo>/build)
#   GENCODE       the target (default: sm_90a, falling back to sm_90)
#   NVCC_FLAGS    extra flags (e.g. "-Xptxas -v", "-lineinfo")
#   CXX           the host linker (default g++)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT_DIR:-$root/build}
obj=$out/obj/nvshmem
say() { echo "build.sh: $*" >&2; }
die() { say "$*"; exit 1; }

nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  if command -v nvcc >/dev/null 2>&1; then nvcc=nvcc
  elif [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
  else die "nvcc not found (set NVCC or CUDA_HOME)"; fi
fi
cuda_home=${CUDA_HOME:-$(cd "$(dirname "$(command -v "$nvcc")")/.." && pwd)}

nv=${NVSHMEM_HOME:-}
if [ -z "$nv" ]; then
  py=${PYTHON:-python3}
  # nvidia is a namespace package: take the first of its folders with nvshmem.
  nv=$("$py" -c "import nvidia,os; print(next((os.path.join(p, 'nvshmem') for p in nvidia.__path__ if os.path.isfile(os.path.join(p, 'nvshmem', 'include', 'nvshmem.h'))), os.path.join(list(nvidia.__path__)[0], 'nvshmem')))" 2>/dev/null) ||
    die "NVSHMEM_HOME is not set and '$py -c \"import nvidia\"' failed: install PyTorch's nvidia-nvshmem wheel or set NVSHMEM_HOME"
fi
[ -f "$nv/include/nvshmem.h" ] || die "no $nv/include/nvshmem.h (set NVSHMEM_HOME to NVSHMEM's folder)"
[ -f "$nv/lib/libnvshmem_device.a" ] || die "no $nv/lib/libnvshmem_device.a"
hostlib=
for cand in libnvshmem_host.so.3 libnvshmem_host.so; do
  if [ -e "$nv/lib/$cand" ]; then hostlib=$cand; break; fi
done
[ -n "$hostlib" ] || die "no $nv/lib/libnvshmem_host.so.3 (nor .so)"
say "NVSHMEM: $nv ($hostlib), nvcc: $("$nvcc" --version | tail -1)"

mkdir -p "$obj"
# 2. Probe the headers.
defs=()
probe() { # probe NAME CALL: compiles a call to see whether the headers declare it
  printf '#include <nvshmem.h>\n#include <nvshmemx.h>\nvoid atp_probe(void *d, cudaStream_t s) { (void)%s; }\n' "$2" >"$obj/probe.cu"
  if "$nvcc" -std=c++17 -arch=sm_90 -rdc=true -I"$nv/include" -c "$obj/probe.cu" -o "$obj/probe.o" >/dev/null 2>&1; then
    defs+=("-D$1"); say "have $1"
  else
    say "no $1 in these headers (the library falls back)"
  fi
}
probe ATP_NV_HAVE_BF16_REDUCE \
  "nvshmemx_bfloat16_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, (__nv_bfloat16 *)d, (const __nv_bfloat16 *)d, 1, s)"
probe ATP_NV_HAVE_REDUCESCATTER \
  "nvshmemx_float_sum_reducescatter_on_stream(NVSHMEM_TEAM_WORLD, (float *)d, (const float *)d, 1, s)"

# libcuda's stub, for any driver symbol the static parts use (recorded only if
# used; the driver's libcuda.so.1 is what loads at run time).
stubs=() nvstubs=()
if [ -f "$cuda_home/lib64/stubs/libcuda.so" ]; then
  stubs=(-L"$cuda_home/lib64/stubs" -Wl,--as-needed -lcuda)
  nvstubs=(-L"$cuda_home/lib64/stubs" -Xlinker --as-needed -lcuda)
fi

cxx=${CXX:-g++}
cudart=(-L"$cuda_home/lib64" -lcudart_static -ldl -lpthread -lrt)

compile() { # compile GENCODE...: the two objects, relocatable device code
  local f
  for f in atp_nvshmem atp_exchange; do
    # shellcheck disable=SC2086
    "$nvcc" -O3 -std=c++17 "$@" -rdc=true -Xcompiler -fPIC,-fvisibility=hidden ${NVCC_FLAGS:-} \
      "${defs[@]}" -I"$nv/include" -I"$here" -c "$here/$f.cu" -o "$obj/$f.o" || return 1
  done
}

link_separate() { # link_separate GENCODE...: nvcc -dlink, then the host linker
  "$nvcc" "$@" -dlink -Xcompiler -fPIC "$obj/atp_nvshmem.o" "$obj/atp_exchange.o" \
    -L"$nv/lib" -lnvshmem_device -o "$obj/dlink.o" || return 1
  "$cxx" -shared -fPIC -o "$out/libasynctp_nvshmem.so" \
    "$obj/atp_nvshmem.o" "$obj/atp_exchange.o" "$obj/dlink.o" \
    -L"$nv/lib" -lnvshmem_device -l:"$hostlib" -Wl,-rpath,"$nv/lib" \
    "${cudart[@]}" "${stubs[@]}" -Wl,--no-undefined -Wl,--exclude-libs,ALL
}

link_nvcc() { # link_nvcc GENCODE...: nvcc device-links and links in one step
  "$nvcc" -shared "$@" -rdc=true -Xcompiler -fPIC -o "$out/libasynctp_nvshmem.so" \
    "$obj/atp_nvshmem.o" "$obj/atp_exchange.o" \
    -L"$nv/lib" -lnvshmem_device -l:"$hostlib" -Xlinker -rpath,"$nv/lib" \
    "${nvstubs[@]}" -Xlinker --no-undefined -Xlinker --exclude-libs,ALL
}

build() { # build GENCODE...
  compile "$@" || return 1
  if link_separate "$@"; then say "linked: nvcc -dlink + $cxx"; return 0; fi
  say "the separate device link failed (above); linking with nvcc -shared instead"
  link_nvcc "$@" && say "linked: nvcc -shared"
}

if [ -n "${GENCODE:-}" ]; then
  # shellcheck disable=SC2086
  build $GENCODE
elif build -gencode arch=compute_90a,code=sm_90a; then
  say "built for sm_90a"
else
  say "the sm_90a build failed (above); retrying for sm_90"
  build -gencode arch=compute_90,code=sm_90
  say "built for sm_90"
fi

so=$out/libasynctp_nvshmem.so
n=$(nm -D --defined-only "$so" | grep -c ' T atp_nv_' || true)
say "$so: $n atp_nv_* entry points"
ldd "$so" | grep -E 'nvshmem|cuda|not found' >&2 || true
if ldd "$so" | grep -q 'not found'; then die "$so has unresolved libraries (above)"; fi
echo "$so"
