package backendtest

import (
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestEmbedding checks Embedding and its backward (accumulated, with
// repeated ids).
func TestEmbedding(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 12)
	const n, v, c = 37, 61, 50
	host := tensor.MustHost(tensor.Int32, n)
	for i := range host.I32() {
		host.I32()[i] = int32(h.rng.IntN(v))
	}
	host.I32()[1], host.I32()[5], host.I32()[n-1] = host.I32()[0], host.I32()[0], v-1
	ids := h.fromHost(host)
	table, out := h.rand(h.dt, v, c), h.out(h.dt, n, c)
	h.b.Embedding(out.dev, table.dev, ids.dev)
	h.ref.Embedding(out.ref, table.ref, ids.ref)
	h.compare("Embedding", out)

	dout, dtable := h.rand(h.dt, n, c), h.rand(h.dt, v, c)
	h.b.EmbeddingBackward(dtable.dev, dout.dev, ids.dev)
	h.ref.EmbeddingBackward(dtable.ref, dout.ref, ids.ref)
	h.compare("EmbeddingBackward", dtable)

	// Frequent ids: buckets of several chunks (the CUDA backend sums 64 rows
	// per block, then the chunks), one of exactly 64 and one of 65.
	const n2 = 700
	host2 := tensor.MustHost(tensor.Int32, n2)
	for i := range host2.I32() {
		switch {
		case i < 64:
			host2.I32()[i] = 7
		case i < 129:
			host2.I32()[i] = 9
		default:
			host2.I32()[i] = int32(h.rng.IntN(4))
		}
	}
	h.rng.Shuffle(n2, func(i, j int) { host2.I32()[i], host2.I32()[j] = host2.I32()[j], host2.I32()[i] })
	ids2 := h.fromHost(host2)
	dout2, dtable2 := h.rand(h.dt, n2, c), h.rand(h.dt, v, c)
	h.b.EmbeddingBackward(dtable2.dev, dout2.dev, ids2.dev)
	h.ref.EmbeddingBackward(dtable2.ref, dout2.ref, ids2.ref)
	h.compare("EmbeddingBackward with frequent ids", dtable2)
}

// TestCrossEntropy checks CrossEntropy with and without dlogits, with
// ignored (negative) targets and a gradient scale.
func TestCrossEntropy(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 13)
	const n, v = 37, 61
	host := tensor.MustHost(tensor.Int32, n)
	for i := range host.I32() {
		host.I32()[i] = int32(h.rng.IntN(v))
	}
	host.I32()[0], host.I32()[7], host.I32()[n-1] = -1, -100, v-1
	targets := h.fromHost(host)
	logits := h.rand(h.dt, n, v)
	h.b.Scale(logits.dev, logits.dev, 4) // a peaked softmax
	h.ref.Scale(logits.ref, logits.ref, 4)

	losses, dlogits := h.out(tensor.Float32, n), h.out(h.dt, n, v)
	const gs = 1.0 / 35
	h.b.CrossEntropy(losses.dev, dlogits.dev, logits.dev, targets.dev, gs)
	h.ref.CrossEntropy(losses.ref, dlogits.ref, logits.ref, targets.ref, gs)
	h.compare("CrossEntropy losses", losses)
	h.compare("CrossEntropy dlogits", dlogits)

	losses = h.out(tensor.Float32, n)
	h.b.CrossEntropy(losses.dev, nil, logits.dev, targets.dev, 1)
	h.ref.CrossEntropy(losses.ref, nil, logits.ref, targets.ref, 1)
	h.compare("CrossEntropy losses without dlogits", losses)

	// A vocabulary of whole 16-byte packs (the CUDA backend keeps such a row
	// in shared memory), with an ignored row, and in place.
	const v2 = 96
	logits2 := h.rand(h.dt, n, v2)
	h.b.Scale(logits2.dev, logits2.dev, 4)
	h.ref.Scale(logits2.ref, logits2.ref, 4)
	host2 := tensor.MustHost(tensor.Int32, n)
	for i := range host2.I32() {
		host2.I32()[i] = int32(h.rng.IntN(v2))
	}
	host2.I32()[3] = -1
	targets2 := h.fromHost(host2)
	losses, dlogits = h.out(tensor.Float32, n), h.out(h.dt, n, v2)
	h.b.CrossEntropy(losses.dev, dlogits.dev, logits2.dev, targets2.dev, gs)
	h.ref.CrossEntropy(losses.ref, dlogits.ref, logits2.ref, targets2.ref, gs)
	h.compare("CrossEntropy losses, V = 96", losses)
	h.compare("CrossEntropy dlogits, V = 96", dlogits)
	losses = h.out(tensor.Float32, n)
	h.b.CrossEntropy(losses.dev, logits2.dev, logits2.dev, targets2.dev, gs)
	h.ref.CrossEntropy(losses.ref, logits2.ref, logits2.ref, targets2.ref, gs)
	h.compare("CrossEntropy losses, V = 96, in place", losses)
	h.compare("CrossEntropy dlogits, V = 96, in place", logits2)
}
