package layers

import (
	"math/rand/v2"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// newBackend returns a fresh CPU backend for one test.
func newBackend() tensor.Backend { return cpu.New() }

// noErr fails the test on err, and on a sticky backend error.
func noErr(t testing.TB, b tensor.Backend, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("backend error: %v", err)
	}
}

// randDevice returns a device tensor of dt with values of magnitude in
// [0.1, 1) and random sign, scaled by s.
func randDevice(t testing.TB, b tensor.Backend, rng *rand.Rand, dt tensor.DType, s float64, shape ...int) *tensor.Tensor {
	t.Helper()
	h := testutil.Rand(rng, tensor.Float64, shape...)
	for i := range h.F64() {
		h.F64()[i] *= s
	}
	d := b.Zeros(dt, shape...)
	b.Upload(d, h)
	noErr(t, b, nil)
	return d
}

// download returns the values of a device tensor as float64.
func download(t testing.TB, b tensor.Backend, x *tensor.Tensor) []float64 {
	t.Helper()
	h := tensor.MustHost(tensor.Float64, x.Shape()...)
	b.Download(h, x)
	noErr(t, b, nil)
	return h.F64()
}

// upload stores vals into the device tensor x.
func upload(t testing.TB, b tensor.Backend, x *tensor.Tensor, vals []float64) {
	t.Helper()
	h, err := tensor.FromFloat64(vals, x.Shape()...)
	if err != nil {
		t.Fatal(err)
	}
	b.Upload(x, h)
	noErr(t, b, nil)
}

// randomizeParams overwrites every weight of ps with values of magnitude in
// [0.1, 1)·s and random sign, so gradient checks see no special structure
// (norm weights of 1, zero biases).
func randomizeParams(t testing.TB, ps *ParamSet, rng *rand.Rand, s float64) {
	t.Helper()
	w, _ := ps.Flat()
	vals := testutil.RandFloats(rng, w.Numel(), 0.1*s, s)
	upload(t, ps.Backend(), w, vals)
}

// hostInts makes a host int32 tensor.
func hostInts(t testing.TB, vals []int32, shape ...int) *tensor.Tensor {
	t.Helper()
	x, err := tensor.FromInt32(vals, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}
