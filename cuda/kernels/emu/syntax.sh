#!/bin/sh
# A syntax pass over the GPU-only code of the kernels, for machines without
# nvcc: g++ -fsyntax-only over gemm_sm90.cu, grouped_sm90.cu, the ep_*.cu and
# attention_wg.cu (with the attention files it builds on)
# with the sm_90a branches enabled (__CUDA_ARCH__ 900, the engine's body) and
# the emulator's header standing in for CUDA's, plus stubs for the few
# intrinsics it lacks. It catches C++ errors (a shadowed parameter, a wrong
# argument count, a type) in code the emulator never compiles; it checks no
# PTX (inline asm strings are not assembled), so nvcc on the GPU machine
# (cuda/kernels/build.sh) stays the real check.
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/check.cc" <<'CC'
#define ASYNCTP_EMU 1
#include "common.cuh"
#undef ASYNCTP_EMU
#undef __align__
#define __align__(n)
#undef __shared__
#define __shared__
inline unsigned long long __cvta_generic_to_shared(const void*) { return 0; }
inline void __trap() {}
inline void __nanosleep(unsigned) {}
inline int atomicMin(int* p, int) { return *p; }
inline void __threadfence() {}
inline void __threadfence_system() {}
using std::max;
using std::min;
#define __CUDA_ARCH__ 900
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#ifndef __grid_constant__
#define __grid_constant__
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#include "gemm_sm90.cu"
#include "grouped_sm90.cu"
#include "ep_layout.cu"
#include "ep_signals.cu"
#include "ep_dispatch.cu"
#include "ep_combine.cu"
#include "ep_fused.cu"
#include "attention_fa2.cu"
#include "attention_wg.cu"
CC
g++ -std=c++17 -fsyntax-only -Wno-unknown-pragmas -I. -x c++ "$tmp/check.cc"
echo "syntax.sh: gemm_sm90.cu, grouped_sm90.cu, ep_*.cu, attention_wg.cu: no C++ errors (PTX not checked)"
