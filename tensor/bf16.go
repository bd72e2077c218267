package tensor

import "math"

// BF16FromFloat32 rounds f to the nearest bfloat16, ties to even. NaN stays
// NaN (quiet), infinities stay infinite, and values that round past the
// largest finite bfloat16 become infinity, as IEEE rounding requires.
func BF16FromFloat32(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep the sign, force a quiet payload bit
		return uint16(u>>16) | 0x40
	}
	// Add 0x7fff plus the lowest kept bit: rounds to nearest, ties to even.
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BF16ToFloat32 widens a bfloat16 exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// RoundBF16 returns f rounded to bfloat16 precision, as a float32.
func RoundBF16(f float32) float32 { return BF16ToFloat32(BF16FromFloat32(f)) }
