package tensor_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

func TestViewsShareStorage(t *testing.T) {
	x, err := tensor.FromFloat32([]float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	r, err := x.Rows(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Shape().Equal(tensor.Shape{2, 4}) || r.Offset() != 4 || r.F32()[0] != 4 {
		t.Fatalf("Rows(1,3) = %v at offset %d starting %v", r.Shape(), r.Offset(), r.F32()[0])
	}
	v, err := r.View(2, 3)
	if err != nil {
		t.Fatal(err)
	}
	v.F32()[0] = -1
	if x.F32()[6] != -1 {
		t.Fatal("a view of a view does not share its storage")
	}
	flat, err := x.Reshape(12)
	if err != nil || flat.Numel() != 12 {
		t.Fatalf("Reshape(12): %v, %v", flat, err)
	}
	if x.Dim(-1) != 4 || x.Dim(0) != 3 || x.Bytes() != 48 {
		t.Fatalf("Dim/Bytes wrong: %d %d %d", x.Dim(-1), x.Dim(0), x.Bytes())
	}
}

func TestBadShapesAreErrors(t *testing.T) {
	x := tensor.MustHost(tensor.Float32, 2, 3)
	for name, f := range map[string]func() error{
		"view past end":     func() error { _, err := x.View(4, 3); return err },
		"negative offset":   func() error { _, err := x.View(-1, 2); return err },
		"reshape numel":     func() error { _, err := x.Reshape(5); return err },
		"rows out of range": func() error { _, err := x.Rows(1, 3); return err },
		"negative dim":      func() error { _, err := tensor.Host(tensor.Float32, 2, -1); return err },
		"invalid dtype":     func() error { _, err := tensor.Host(tensor.Invalid, 2); return err },
		"short data":        func() error { _, err := tensor.FromFloat32(make([]float32, 5), 2, 3); return err },
		"unknown dtype":     func() error { _, err := tensor.ParseDType("f16"); return err },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestAccessorsMatchDType(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16} {
		x := tensor.MustHost(dt, 5)
		got := map[string]bool{"f32": x.F32() != nil, "f64": x.F64() != nil, "i32": x.I32() != nil, "bf16": x.BF16() != nil}
		for name, ok := range got {
			if ok != (name == dt.String()) {
				t.Errorf("%v tensor: accessor %s non-nil = %v", dt, name, ok)
			}
		}
		if back, err := tensor.ParseDType(dt.String()); err != nil || back != dt {
			t.Errorf("ParseDType(%q) = %v, %v", dt.String(), back, err)
		}
		vals := []float64{1.5, -2, 3, 0.25, 7}
		if err := x.SetFloat64s(vals); err != nil {
			t.Fatal(err)
		}
		out, err := x.Float64s()
		if err != nil {
			t.Fatal(err)
		}
		want := []float64{1.5, -2, 3, 0.25, 7}
		if dt == tensor.Int32 {
			want = []float64{1, -2, 3, 0, 7}
		}
		for i := range want {
			if out[i] != want[i] {
				t.Errorf("%v: element %d is %v, want %v", dt, i, out[i], want[i])
			}
		}
	}
}

func TestBF16RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		in   uint32 // float32 bits
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1.0 exact
		{0x3f808000, 0x3f80}, // tie, kept bit even: down
		{0x3f818000, 0x3f82}, // tie, kept bit odd: up
		{0x3f808001, 0x3f81}, // just above the tie: up
		{0x3f807fff, 0x3f80}, // just below the tie: down
		{0x7f7fffff, 0x7f80}, // largest float32 rounds to +Inf
		{0xff800000, 0xff80}, // -Inf stays
	}
	for _, c := range cases {
		if got := tensor.BF16FromFloat32(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("BF16FromFloat32(%#08x) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if nan := tensor.BF16ToFloat32(tensor.BF16FromFloat32(float32(math.NaN()))); !math.IsNaN(float64(nan)) {
		t.Errorf("NaN became %v", nan)
	}
	// A NaN whose payload lives only in the low bits must stay NaN, not become Inf.
	if nan := tensor.BF16ToFloat32(tensor.BF16FromFloat32(math.Float32frombits(0x7f800001))); !math.IsNaN(float64(nan)) {
		t.Errorf("low-payload NaN became %v", nan)
	}
}

func ExampleTensor_Rows() {
	x, _ := tensor.FromFloat32([]float32{1, 2, 3, 4, 5, 6}, 3, 2)
	mid, _ := x.Rows(1, 2)
	fmt.Println(mid, mid.F32())
	// Output: f32(1, 2)@cpu [3 4]
}
