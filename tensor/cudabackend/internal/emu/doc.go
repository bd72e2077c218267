// Package emu runs the CUDA backend's kernels on the CPU: the .cu sources of
// cuda/kernels compiled as C++ against a small emulator of the CUDA features
// they use (cuda/kernels/emu: blocks run one at a time, each CUDA thread a
// coroutine, barriers and warp shuffles switch between them). Device memory
// is C heap memory and GEMMs are plain loops.
//
// It exists to test, on machines without a GPU, what the real GPU cannot be
// asked about there: the kernels' arithmetic and indexing, and the backend's
// launches (grids, argument lists and their C types, which the emulator
// checks against each kernel's signature). It says nothing about speed,
// memory-model races or occupancy.
//
// The package builds only with the build tag asynctp_emu (it needs a C++17
// compiler):
//
//	go test -tags asynctp_emu ./tensor/cudabackend/...
package emu
