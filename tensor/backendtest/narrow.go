package backendtest

import (
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestNarrow checks the row ops on the narrow shapes that the
// vocab-parallel cross-entropy (parallel/tp) and the loss sums run on the
// device: CrossEntropy and Softmax over a few columns (one per TP rank),
// Embedding of a one-column table (a gather of scalars), and SumRows of
// many rows of one or two columns (Σ per-row losses), where a kernel tiled
// for wide rows meets its edges.
func TestNarrow(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 17)
	const n = 301
	for _, v := range []int{1, 2, 3, 4, 8} {
		host := tensor.MustHost(tensor.Int32, n)
		for i := range host.I32() {
			host.I32()[i] = int32(h.rng.IntN(v))
		}
		host.I32()[0], host.I32()[n/2] = -1, -1
		targets := h.fromHost(host)
		logits := h.rand(h.dt, n, v)
		h.b.Scale(logits.dev, logits.dev, 8)
		h.ref.Scale(logits.ref, logits.ref, 8)
		losses, dlogits := h.out(tensor.Float32, n), h.out(h.dt, n, v)
		h.b.CrossEntropy(losses.dev, dlogits.dev, logits.dev, targets.dev, 0.5)
		h.ref.CrossEntropy(losses.ref, dlogits.ref, logits.ref, targets.ref, 0.5)
		h.compare(fmt.Sprintf("CrossEntropy losses over %d columns", v), losses)
		if v > 1 { // one column: the gradient is 0 everywhere
			h.compare(fmt.Sprintf("CrossEntropy dlogits over %d columns", v), dlogits)
		}
		sm := h.out(h.dt, n, v)
		h.b.Softmax(sm.dev, logits.dev)
		h.ref.Softmax(sm.ref, logits.ref)
		h.compare(fmt.Sprintf("Softmax over %d columns", v), sm)
	}

	const rows = 2*n + 1
	ids := tensor.MustHost(tensor.Int32, n)
	for i := range ids.I32() {
		ids.I32()[i] = int32(h.rng.IntN(rows))
	}
	ids.I32()[n-1] = rows - 1
	idx := h.fromHost(ids)
	table, out := h.rand(h.dt, rows, 1), h.out(h.dt, n, 1)
	h.b.Embedding(out.dev, table.dev, idx.dev)
	h.ref.Embedding(out.ref, table.ref, idx.ref)
	h.compare("Embedding of a one-column table", out)

	for _, c := range []int{1, 2} {
		x, sum := h.rand(h.dt, 4099, c), h.rand(h.dt, c)
		h.b.SumRows(sum.dev, x.dev)
		h.ref.SumRows(sum.ref, x.ref)
		h.compare(fmt.Sprintf("SumRows of 4099 rows of %d", c), sum)
	}
}
