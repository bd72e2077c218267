package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// ToFloat32 keeps a float32 tensor, widens bf16 exactly and rounds float64
// to the nearest float32, keeping the shape.
func TestToFloat32(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	f64 := make([]float64, 6)
	for i := range f64 {
		f64[i] = rng.NormFloat64() * 3
	}
	x, _ := FromFloat64(f64, 2, 3)
	y, err := ToFloat32(x)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range y.F32() {
		if v != float32(f64[i]) || y.Shape()[0] != 2 || y.Shape()[1] != 3 {
			t.Fatalf("float64 element %d: %v of shape %v, want %v of (2, 3)", i, v, y.Shape(), float32(f64[i]))
		}
	}
	if z, err := ToFloat32(y); err != nil || z != y {
		t.Fatalf("a float32 tensor: %v, %v; want itself", z, err)
	}
	b := MustHost(BFloat16, 6)
	for i := range b.BF16() {
		b.BF16()[i] = BF16FromFloat32(float32(f64[i]))
	}
	w, err := ToFloat32(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range w.F32() {
		if v != BF16ToFloat32(b.BF16()[i]) || math.IsNaN(float64(v)) {
			t.Fatalf("bf16 element %d: %v, want %v", i, v, BF16ToFloat32(b.BF16()[i]))
		}
	}
}
