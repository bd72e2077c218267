package rowmajor

import "github.com/asynctp/asynctp/tensor"

// Slice returns the values of the slice [lo, hi) along dimension dim of a
// row-major tensor of shape full holding v (all of v for dim < 0).
func Slice(v []float64, full []int, dim, lo, hi int) []float64 {
	if dim < 0 {
		return v
	}
	inner := tensor.Shape(full[dim+1:]).Numel()
	outer := tensor.Shape(full[:dim]).Numel()
	var out []float64
	for o := range outer {
		base := o * full[dim] * inner
		out = append(out, v[base+lo*inner:base+hi*inner]...)
	}
	return out
}
