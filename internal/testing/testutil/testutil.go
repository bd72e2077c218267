package testutil

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/asynctp/asynctp/internal/rowmajor"
	"github.com/asynctp/asynctp/tensor"
)

// Rng returns a deterministic generator for a test.
func Rng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// RandFloats returns n values uniform in ±[lo, hi) with random sign; never 0
// for lo > 0.
func RandFloats(rng *rand.Rand, n int, lo, hi float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		v := lo + (hi-lo)*rng.Float64()
		if rng.IntN(2) == 0 {
			v = -v
		}
		out[i] = v
	}
	return out
}

// Rand returns a host tensor of dt filled with values of magnitude in
// [0.1, 1) and random sign.
func Rand(rng *rand.Rand, dt tensor.DType, shape ...int) *tensor.Tensor {
	t := tensor.MustHost(dt, shape...)
	if err := t.SetFloat64s(RandFloats(rng, t.Numel(), 0.1, 1)); err != nil {
		panic(err)
	}
	return t
}

// RandInts returns a host int32 tensor of values in [0, n).
func RandInts(rng *rand.Rand, n int, shape ...int) *tensor.Tensor {
	t := tensor.MustHost(tensor.Int32, shape...)
	for i := range t.I32() {
		t.I32()[i] = int32(rng.IntN(n))
	}
	return t
}

// RelErr is ‖a − b‖ / ‖b‖ (‖a − b‖ when b is zero). NaN or Inf anywhere
// gives +Inf, so a NaN never passes a tolerance.
func RelErr(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range a {
		if math.IsNaN(a[i]) || math.IsNaN(b[i]) || math.IsInf(a[i], 0) || math.IsInf(b[i], 0) {
			return math.Inf(1)
		}
		d := a[i] - b[i]
		num += d * d
		den += b[i] * b[i]
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// Values returns the elements of a host tensor as float64.
func Values(t testing.TB, x *tensor.Tensor) []float64 {
	t.Helper()
	v, err := x.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// AllClose fails the test when RelErr(got, want) > tol.
func AllClose(t testing.TB, name string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values, want %d", name, len(got), len(want))
	}
	if e := RelErr(got, want); !(e <= tol) {
		t.Fatalf("%s: relative error %.3g > %.3g (first values got %v want %v)", name, e, tol, head(got), head(want))
	}
}

func head(v []float64) []float64 {
	if len(v) > 4 {
		return v[:4]
	}
	return v
}

// NumGrad returns the central finite-difference gradient of f with respect to
// x (perturbed in place and restored): (f(x+h) − f(x−h)) / 2h per element.
func NumGrad(f func() float64, x []float64, h float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		orig := x[i]
		x[i] = orig + h
		fp := f()
		x[i] = orig - h
		fm := f()
		x[i] = orig
		g[i] = (fp - fm) / (2 * h)
	}
	return g
}

// Dot is Σ a·b, the usual way to turn an output into a scalar loss for a
// gradient check (L = Σ out·w with random w, so ∂L/∂out = w).
func Dot(a, b []float64) float64 {
	if len(a) != len(b) {
		panic(fmt.Sprintf("testutil.Dot: lengths %d and %d", len(a), len(b)))
	}
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// Within returns an error when RelErr(got, want) > tol: AllClose for code
// that reports instead of failing (the ranks of a multi-rank test).
func Within(name string, got, want []float64, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d values, want %d", name, len(got), len(want))
	}
	if e := RelErr(got, want); !(e <= tol) {
		return fmt.Errorf("%s: relative error %.3g > %.3g", name, e, tol)
	}
	return nil
}

// ErrorContains fails the test unless err is non-nil and its message holds
// every part.
func ErrorContains(t testing.TB, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not contain %q", err, p)
		}
	}
}

// Download copies a tensor of b (on its device or the host) into float64s.
func Download(b tensor.Backend, x *tensor.Tensor) []float64 {
	h := tensor.MustHost(tensor.Float64, x.Shape()...)
	b.Download(h, x)
	return h.F64()
}

// Slice returns the values of the slice [lo, hi) along dimension dim of a
// row-major tensor of shape full holding v (all of v for dim < 0): the
// shard of a parameter that a rank holds.
func Slice(v []float64, full []int, dim, lo, hi int) []float64 {
	return rowmajor.Slice(v, full, dim, lo, hi)
}

// HostReads wraps a backend and counts the calls that read its device back
// to the host (Download, Sync, SumSquares), so a test can check that a
// pass queues its work without waiting for it. It hides the optional op
// sets (tensor.MoEOps) of the backend it wraps.
type HostReads struct {
	tensor.Backend
	n atomic.Int64
}

// Count returns the host reads so far.
func (h *HostReads) Count() int { return int(h.n.Load()) }

// Download counts one read.
func (h *HostReads) Download(dst, src *tensor.Tensor) {
	h.n.Add(1)
	h.Backend.Download(dst, src)
}

// Sync counts one read.
func (h *HostReads) Sync() error {
	h.n.Add(1)
	return h.Backend.Sync()
}

// SumSquares counts one read.
func (h *HostReads) SumSquares(x *tensor.Tensor) float64 {
	h.n.Add(1)
	return h.Backend.SumSquares(x)
}

// Upload makes a (rows, cols) tensor of dt on b holding vals (rounded to
// dt), the way a check puts its reference inputs on the device.
func Upload(b tensor.Backend, dt tensor.DType, vals []float64, rows, cols int) *tensor.Tensor {
	h := tensor.MustHost(dt, rows, cols)
	if err := h.SetFloat64s(vals); err != nil {
		panic(fmt.Sprintf("testutil: Upload: %v", err)) // the caller's sizes disagree: a bug in the check
	}
	d := b.Zeros(dt, rows, cols)
	b.Upload(d, h)
	return d
}

// Poisoned is a (rows, cols) output tensor of dt on b filled with NaN, so an
// element the op under test does not write fails the check.
func Poisoned(b tensor.Backend, dt tensor.DType, rows, cols int) *tensor.Tensor {
	t := b.Zeros(dt, rows, cols)
	b.Fill(t, math.NaN())
	return t
}
