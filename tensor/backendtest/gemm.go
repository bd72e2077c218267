package backendtest

import (
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestMatMul checks MatMul for the four transpose combinations, 2-D and
// batched 3-D, with beta = 0 over a NaN-poisoned C and with an accumulating
// alpha, beta.
func TestMatMul(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 3)
	const m, n, k = 37, 50, 23
	for _, batch := range []int{0, 3} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			for _, ab := range [][2]float32{{1, 0}, {0.5, 0.75}} {
				name := fmt.Sprintf("batch=%d transA=%v transB=%v alpha=%v beta=%v", batch, tr[0], tr[1], ab[0], ab[1])
				shape := func(r, c int) []int {
					if batch > 0 {
						return []int{batch, r, c}
					}
					return []int{r, c}
				}
				sa, sb := shape(m, k), shape(k, n)
				if tr[0] {
					sa = shape(k, m)
				}
				if tr[1] {
					sb = shape(n, k)
				}
				a, bb := h.rand(h.dt, sa...), h.rand(h.dt, sb...)
				var c pair
				if ab[1] == 0 {
					c = h.out(h.dt, shape(m, n)...)
				} else {
					c = h.rand(h.dt, shape(m, n)...)
				}
				h.b.MatMul(c.dev, a.dev, bb.dev, tr[0], tr[1], ab[0], ab[1])
				h.ref.MatMul(c.ref, a.ref, bb.ref, tr[0], tr[1], ab[0], ab[1])
				h.compare("MatMul "+name, c)
			}
		}
	}
}
