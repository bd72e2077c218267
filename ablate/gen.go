package ablate

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// gen makes the inputs of every rank without storing them: element (i, j)
// of rank q's input `what` is a hash of (seed, what, q, i, j) mapped to
// [-1, 1) and rounded to the dtype, so any rank (and the sampled float64
// reference) can compute any rank's element on demand.
type gen struct {
	seed uint64
	dt   tensor.DType
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func whatHash(what string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(what); i++ {
		h = (h ^ uint64(what[i])) * 1099511628211
	}
	return h
}

// at is element (i, j) of rank q's `what`, whose rows have cols columns.
func (g gen) at(what uint64, q, i, j, cols int) float64 {
	x := splitmix(g.seed ^ what ^ splitmix(uint64(q)<<40^uint64(i*cols+j)))
	return g.dt.Round(float64(x>>11)/float64(1<<53)*2 - 1)
}

// upload makes rank q's `what` (rows, cols) on b; rowOff shifts the row
// index (a shard of a larger input).
func (g gen) upload(b tensor.Backend, what string, q, rows, cols, rowOff int) (*tensor.Tensor, error) {
	h := tensor.MustHost(g.dt, rows, cols)
	v := make([]float64, rows*cols)
	wh := whatHash(what)
	for i := range rows {
		for j := range cols {
			v[i*cols+j] = g.at(wh, q, i+rowOff, j, cols)
		}
	}
	if err := h.SetFloat64s(v); err != nil {
		return nil, err
	}
	d := b.Zeros(g.dt, rows, cols)
	b.Upload(d, h)
	return d, nil
}

// download is t's values in float64.
func download(b tensor.Backend, t *tensor.Tensor) ([]float64, error) {
	h := tensor.MustHost(t.DType(), t.Shape()...)
	b.Download(h, t)
	if err := b.Sync(); err != nil {
		return nil, err
	}
	return h.Float64s()
}

// relErr is ‖a − ref‖ / ‖ref‖; +Inf when a has a NaN or the lengths
// differ.
func relErr(a, ref []float64) float64 {
	if len(a) != len(ref) {
		return math.Inf(1)
	}
	var d, n float64
	for i := range a {
		if math.IsNaN(a[i]) {
			return math.Inf(1)
		}
		d += (a[i] - ref[i]) * (a[i] - ref[i])
		n += ref[i] * ref[i]
	}
	if n == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / n)
}

// Tolerance is the bound on the relative error of a cell against its
// reference: bf16 1e-2, f32 1e-5, f64 1e-12.
func Tolerance(dt tensor.DType) float64 { return dt.Tolerance() }

// TolFor is the tolerance of the op's cells: Tolerance, or for the layer
// cells layerTolerance.
func TolFor(op Op, dt tensor.DType) float64 {
	if op.IsLayer() {
		return layerTolerance(dt)
	}
	return Tolerance(dt)
}

// DTypeOf maps the matrix's dtype names.
func DTypeOf(s string) tensor.DType {
	switch s {
	case "f64":
		return tensor.Float64
	case "bf16":
		return tensor.BFloat16
	}
	return tensor.Float32
}
