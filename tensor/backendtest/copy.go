package backendtest

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// exact fails unless got and want are equal element by element (NaN equals
// NaN).
func (h *harness) exact(name string, got, want []float64) {
	h.t.Helper()
	if len(got) != len(want) {
		h.t.Fatalf("%s: got %d values, want %d", name, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
			h.t.Errorf("%s: element %d is %v, want %v", name, i, got[i], want[i])
			return
		}
	}
}

// bf16Specials are float32 values whose bfloat16 rounding is easy to get
// wrong: ties (to even, down and up), values just above a tie, the largest
// finite values, overflow, infinities, NaN and signed zero.
var bf16Specials = []float32{
	1, -1, 0, float32(math.Copysign(0, -1)),
	math.Float32frombits(0x3f808000),            // 1 + 2⁻⁸: a tie, rounds down to even 1
	math.Float32frombits(0x3f818000),            // a tie between 0x3f81 and 0x3f82: rounds up to even
	math.Float32frombits(0x3f808001),            // just above a tie: rounds up
	math.Float32frombits(0x3f807fff),            // just below a tie: rounds down
	math.Float32frombits(0x7f7f7fff),            // rounds to the largest finite bfloat16
	math.MaxFloat32,                             // overflows to +Inf
	-math.MaxFloat32,                            // overflows to −Inf
	float32(math.Inf(1)), float32(math.Inf(-1)), // stay infinite
	float32(math.NaN()),
	1e-40, // subnormal
	1.0 / 3, -2.0 / 3, 3.14159265,
}

// TestCopy checks Upload, Download and Copy: round trips in the compute
// dtype and in Int32, the conversions between the compute dtype, Float32 and
// BFloat16 (bfloat16 rounds to nearest even), and a copy into a view.
func TestCopy(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 1)

	// Round trips are exact.
	host := testutil.Rand(h.rng, h.dt, 37, 50)
	p := h.fromHost(host)
	h.exact("Upload/Download "+h.dt.String(), h.download(p.dev), testutil.Values(t, host))
	ids := testutil.RandInts(h.rng, 1000, 37)
	pi := h.fromHost(ids)
	h.exact("Upload/Download i32", h.download(pi.dev), testutil.Values(t, ids))

	// Copy in the same dtype.
	c := h.b.Zeros(h.dt, 37, 50)
	h.b.Copy(c, p.dev)
	h.exact("Copy "+h.dt.String(), h.download(c), testutil.Values(t, host))

	// Float32 to BFloat16 and back, on random values and on the specials.
	vals := append(testutil.RandFloats(h.rng, 61, 0.1, 1000), make([]float64, len(bf16Specials))...)
	f32 := make([]float32, len(vals))
	for i := range vals {
		if i >= 61 {
			f32[i] = bf16Specials[i-61]
		} else {
			f32[i] = float32(vals[i])
		}
	}
	src, err := tensor.FromFloat32(f32, len(f32))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float64, len(f32))
	for i, v := range f32 {
		want[i] = float64(tensor.RoundBF16(v))
	}
	d32 := h.fromHost(src).dev
	d16 := h.b.Zeros(tensor.BFloat16, len(f32))
	h.b.Copy(d16, d32)
	h.exact("Copy f32→bf16", h.download(d16), want)
	back := h.b.Zeros(tensor.Float32, len(f32))
	h.b.Copy(back, d16)
	h.exact("Copy bf16→f32", h.download(back), want)

	// The compute dtype to Float32 and back.
	x := h.rand(h.dt, 37, 50)
	x32 := h.b.Zeros(tensor.Float32, 37, 50)
	h.b.Copy(x32, x.dev)
	h.exact("Copy "+h.dt.String()+"→f32", h.download(x32), roundTo(tensor.Float32, x.ref.F64()))
	y := h.b.Zeros(h.dt, 37, 50)
	h.b.Copy(y, x32)
	h.exact("Copy f32→"+h.dt.String(), h.download(y), roundTo(h.dt, roundTo(tensor.Float32, x.ref.F64())))

	// A copy into rows [3, 7) of a (10, 8) tensor leaves the other rows.
	big := h.b.Zeros(h.dt, 10, 8)
	view, err := big.Rows(3, 7)
	if err != nil {
		t.Fatal(err)
	}
	part := h.rand(h.dt, 4, 8)
	h.b.Copy(view, part.dev)
	wantBig := make([]float64, 80)
	copy(wantBig[24:56], part.ref.F64())
	h.exact("Copy into a view", h.download(big), wantBig)
	h.sync()
}

// roundTo rounds float64 values to dt.
func roundTo(dt tensor.DType, v []float64) []float64 {
	t := tensor.MustHost(dt, len(v))
	if err := t.SetFloat64s(v); err != nil {
		panic(err)
	}
	out, _ := t.Float64s()
	return out
}

// TestFill checks Fill on the compute dtype, Float32, BFloat16 and Int32,
// with values that need rounding, on whole tensors and on a view.
func TestFill(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 2)
	for _, dt := range []tensor.DType{h.dt, tensor.Float32, tensor.BFloat16} {
		for _, v := range []float64{0.5, -3, 1.0 / 3, math.Inf(-1), math.NaN()} {
			x := h.b.Zeros(dt, 37, 5)
			h.b.Fill(x, v)
			want := roundTo(dt, []float64{v})[0]
			got := h.download(x)
			all := make([]float64, len(got))
			for i := range all {
				all[i] = want
			}
			h.exact("Fill "+dt.String(), got, all)
		}
	}
	ids := h.b.Zeros(tensor.Int32, 7)
	h.b.Fill(ids, -1)
	h.exact("Fill i32", h.download(ids), []float64{-1, -1, -1, -1, -1, -1, -1})

	big := h.b.Zeros(h.dt, 10, 8)
	view, err := big.View(13, 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	h.b.Fill(view, 2)
	want := make([]float64, 80)
	for i := 13; i < 23; i++ {
		want[i] = 2
	}
	h.exact("Fill a view", h.download(big), want)
	h.sync()
}
