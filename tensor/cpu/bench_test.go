package cpu_test

import (
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

func BenchmarkMatMul(b *testing.B) {
	for _, n := range []int{512, 1024} {
		b.Run(fmt.Sprintf("f32-%d", n), func(b *testing.B) {
			rng := testutil.Rng(1)
			be := cpu.New()
			x, y, z := testutil.Rand(rng, tensor.Float32, n, n), testutil.Rand(rng, tensor.Float32, n, n), f32(n, n)
			b.ResetTimer()
			for b.Loop() {
				be.MatMul(z, x, y, false, false, 1, 0)
			}
			b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			if err := be.Err(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkMatMulNaive is the reference the gonum-backed MatMul is compared
// with in the same run: the plain i-k-j triple loop over float32.
func BenchmarkMatMulNaive(b *testing.B) {
	const n = 512
	rng := testutil.Rng(1)
	x, y := testutil.Rand(rng, tensor.Float32, n, n).F32(), testutil.Rand(rng, tensor.Float32, n, n).F32()
	z := make([]float32, n*n)
	for b.Loop() {
		clear(z)
		for i := 0; i < n; i++ {
			for k := 0; k < n; k++ {
				a := x[i*n+k]
				row := y[k*n : (k+1)*n]
				out := z[i*n : (i+1)*n]
				for j, v := range row {
					out[j] += a * v
				}
			}
		}
	}
	b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkAttention(b *testing.B) {
	const nb, nt, nh, d = 2, 256, 8, 64
	rng := testutil.Rng(2)
	be := cpu.New()
	r := func() *tensor.Tensor { return testutil.Rand(rng, tensor.Float32, nb, nt, nh, d) }
	q, k, v, dout := r(), r(), r(), r()
	out, lse := f32(nb, nt, nh, d), f32(nb, nh, nt)
	dq, dk, dv := f32(nb, nt, nh, d), f32(nb, nt, nh, d), f32(nb, nt, nh, d)
	// Causal: about half of the T² scores, 2·D flops each for q·k and for p·v.
	flops := float64(nb*nh) * float64(nt*(nt+1)/2) * 4 * d
	b.Run("forward", func(b *testing.B) {
		for b.Loop() {
			be.Attention(out, lse, q, k, v, 0.125)
		}
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
	b.Run("backward", func(b *testing.B) {
		for b.Loop() {
			be.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, 0.125)
		}
		b.ReportMetric(2.5*flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
	if err := be.Err(); err != nil {
		b.Fatal(err)
	}
}
