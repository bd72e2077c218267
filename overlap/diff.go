package overlap

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// Diff says how far a tensor of a strategy (got) is from the same tensor
// of the reference (want), element by element:
//
//   - Rel = ‖got − want‖ / ‖want‖ (Euclidean norms over the tensor): the
//     measure of the project's tolerances (float32 1e-5, bf16 1e-2 between
//     two strategies), 0 when both are equal, +Inf when want is all zeros
//     and got is not, or a value is NaN;
//   - ULP = max_i of the distance between got_i and want_i in units of the
//     last place of the tensor's dtype (float32, float64, bf16): the
//     number of representable values between them, 0 exactly when the
//     bits are equal (+0 and −0 count as equal; +Inf with a NaN).
//
// Rel is the bound to test against (near a sum that cancels, an element
// can be many ULPs off while the tensor is within its rounding); ULP says
// whether two paths give the same bits and, when they do not, by how
// much the rounding differs.
type Diff struct {
	Rel   float64 // the relative difference (above)
	ULP   float64 // the largest distance of two elements in ULPs
	Index int     // the element of the largest |got − want|; −1 when all are equal
	Got   float64 // got's value there
	Want  float64 // want's value there
}

// Worse reports whether d is worse than o: a larger Rel, or an equal Rel
// and a larger ULP.
func (d Diff) Worse(o Diff) bool {
	if d.Rel != o.Rel {
		return d.Rel > o.Rel || math.IsNaN(d.Rel)
	}
	return d.ULP > o.ULP
}

// Compare returns the Diff of got against want: two tensors of the same
// float dtype and number of elements, in host memory (see CompareOn for
// device tensors).
func Compare(got, want *tensor.Tensor) (Diff, error) {
	if got == nil || want == nil || got.DType() != want.DType() || got.Numel() != want.Numel() {
		return Diff{}, fmt.Errorf("overlap: compare %v with %v: expected two tensors of one float dtype and size", got, want)
	}
	switch got.DType() {
	case tensor.Float32:
		if g, w := got.F32(), want.F32(); g != nil && w != nil {
			return compareBits(g, w, func(v float32) float64 { return float64(v) },
				func(a, b float32) float64 { return ulps(uint64(math.Float32bits(a)), uint64(math.Float32bits(b)), 32) }), nil
		}
	case tensor.Float64:
		if g, w := got.F64(), want.F64(); g != nil && w != nil {
			return compareBits(g, w, func(v float64) float64 { return v },
				func(a, b float64) float64 { return ulps(math.Float64bits(a), math.Float64bits(b), 64) }), nil
		}
	case tensor.BFloat16:
		if g, w := got.BF16(), want.BF16(); g != nil && w != nil {
			return compareBits(g, w, func(v uint16) float64 { return float64(tensor.BF16ToFloat32(v)) },
				func(a, b uint16) float64 { return ulps(uint64(a), uint64(b), 16) }), nil
		}
	default:
		return Diff{}, fmt.Errorf("overlap: compare %v with %v: expected float32, float64 or bf16", got, want)
	}
	return Diff{}, fmt.Errorf("overlap: compare %v with %v: expected host tensors (CompareOn downloads device ones)", got, want)
}

// CompareOn is Compare for tensors of backend b: it reads both back to the
// host (which waits for the work that writes them).
func CompareOn(b tensor.Backend, got, want *tensor.Tensor) (Diff, error) {
	hg, err := toHost(b, got)
	if err != nil {
		return Diff{}, err
	}
	hw, err := toHost(b, want)
	if err != nil {
		return Diff{}, err
	}
	if err := b.Err(); err != nil {
		return Diff{}, err
	}
	return Compare(hg, hw)
}

func toHost(b tensor.Backend, t *tensor.Tensor) (*tensor.Tensor, error) {
	if t == nil {
		return nil, fmt.Errorf("overlap: compare: nil tensor")
	}
	if t.Device() == tensor.HostDevice {
		return t, nil
	}
	h, err := tensor.Host(t.DType(), t.Numel())
	if err != nil {
		return nil, err
	}
	b.Download(h, t)
	return h, nil
}

// compareBits is Compare over two slices of one dtype: val gives an
// element's value, dist the distance of two elements in ULPs.
func compareBits[T any](got, want []T, val func(T) float64, dist func(a, b T) float64) Diff {
	d := Diff{Index: -1}
	var maxDiff, sumDiff, sumRef float64
	for i := range got {
		g, w := val(got[i]), val(want[i])
		if math.IsNaN(g) || math.IsNaN(w) {
			if !math.IsInf(maxDiff, 1) {
				d.Index, d.Got, d.Want = i, g, w
			}
			d.ULP, maxDiff = math.Inf(1), math.Inf(1)
			continue
		}
		sumRef += w * w
		if u := dist(got[i], want[i]); u > d.ULP {
			d.ULP = u
		}
		e := math.Abs(g - w)
		sumDiff += e * e
		if e > maxDiff {
			maxDiff, d.Index, d.Got, d.Want = e, i, g, w
		}
	}
	switch {
	case math.IsInf(maxDiff, 1) || math.IsInf(sumDiff, 1):
		d.Rel = math.Inf(1)
	case maxDiff == 0:
		d.Rel = 0
	case sumRef == 0:
		d.Rel = math.Inf(1)
	default:
		d.Rel = math.Sqrt(sumDiff) / math.Sqrt(sumRef)
	}
	return d
}

// ulps is the distance in units of the last place of two floats of the
// given width (16: bf16, 32, 64) given by their bits: the number of
// representable values from one to the other (+0 and −0 are one value).
// Values of one sign are ordered by their bits' magnitude, so the distance
// is the difference of the magnitudes, or their sum across zero.
func ulps(a, b uint64, width uint) float64 {
	sign := uint64(1) << (width - 1)
	ma, mb := a&(sign-1), b&(sign-1)
	if a&sign == b&sign || ma == 0 || mb == 0 {
		if ma > mb {
			return float64(ma - mb)
		}
		return float64(mb - ma)
	}
	return float64(ma) + float64(mb)
}
