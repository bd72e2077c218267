//go:build asynctp_emu

// The kernels and the emulator, as one C++ translation unit.
#include "emu/emu.cc"
