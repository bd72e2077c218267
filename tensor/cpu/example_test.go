package cpu_test

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

func Example() {
	b := cpu.New()
	x, _ := tensor.FromFloat32([]float32{3, 4, 0, 0, -1, 1}, 2, 3) // (N, C) = (2, 3)
	w, _ := tensor.FromFloat32([]float32{1, 1, 2}, 3)
	out, rstd := b.Zeros(tensor.Float32, 2, 3), b.Zeros(tensor.Float32, 2)
	b.RMSNorm(out, rstd, x, w, 0)

	bad := b.Zeros(tensor.Float32, 2)
	b.RMSNorm(out, rstd, x, bad, 0) // w must have C = 3 elements
	fmt.Printf("%.4f\n", out.F32())
	fmt.Println(b.Err())
	// Output:
	// [1.0392 1.3856 0.0000 0.0000 -1.2247 2.4495]
	// cpu: RMSNorm: w has shape (2), expected (3) to match the last dim of x (2, 3)
}
