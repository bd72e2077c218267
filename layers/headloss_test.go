package layers

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestChunkedHeadLoss: the GPT's LM head fused with the cross-entropy in
// chunks of rows (uneven ones, and one chunk of all rows) gives the loss,
// the logits (computed on demand) and every gradient of the unfused head
// and loss, in float64 on random weights, over two steps (the weight
// gradient buffer is overwritten, not accumulated, by a new forward); the
// whole logits and their gradient are never allocated on a training step;
// and a forward alone leaves the parameters' gradients as they were.
func TestChunkedHeadLoss(t *testing.T) {
	const B, T = 2, 5
	rng := testutil.Rng(9)
	ids := testutil.RandInts(rng, tinyConfig.Vocab, B, T)
	targets := testutil.RandInts(rng, tinyConfig.Vocab, B, T)
	targets.I32()[3] = -1
	type result struct {
		losses, logits, grads []float64
	}
	run := func(chunkRows int, tied bool) (result, *GPT) {
		b := newBackend()
		cfg := tinyConfig
		cfg.TiedEmbeddings = tied // tied: the embedding shares the head's gradient
		m, err := NewGPT(b, cfg, tensor.Float64)
		noErr(t, b, err)
		randomizeParams(t, m.Params(), testutil.Rng(5), 0.3)
		if chunkRows < 0 {
			m.Decoder.p.HeadLoss = nil // the unfused head and loss
		} else {
			m.HeadLoss.ChunkRows = chunkRows
		}
		var r result
		for range 2 {
			m.ZeroGrad()
			l, err := m.Forward(ids, targets)
			noErr(t, b, err)
			noErr(t, b, m.Backward())
			r.losses = append(r.losses, l)
		}
		r.logits = download(t, b, m.Logits())
		_, g := m.Params().Flat()
		r.grads = download(t, b, g)
		return r, m
	}
	for _, c := range []struct {
		rows int
		tied bool
	}{{3, true}, {4, false}, {0, true}} { // chunks 3, 3, 3, 1; 4, 4, 2; the default: one chunk
		rows := c.rows
		want, _ := run(-1, c.tied)
		got, m := run(rows, c.tied)
		if math.Abs(got.losses[0]-want.losses[0]) > 1e-12 || math.Abs(got.losses[1]-want.losses[1]) > 1e-12 {
			t.Errorf("chunk rows %d: losses %v, unfused %v", rows, got.losses, want.losses)
		}
		if err := testutil.Within("logits", got.logits, want.logits, 1e-12); err != nil {
			t.Errorf("chunk rows %d: %v", rows, err)
		}
		if err := testutil.Within("gradients", got.grads, want.grads, 1e-12); err != nil {
			t.Errorf("chunk rows %d: %v", rows, err)
		}
		if m.Decoder.dlogits != nil {
			t.Errorf("chunk rows %d: the (N, V) logits gradient was allocated", rows)
		}
		// A forward alone (a validation pass) does not touch the gradients.
		m.ZeroGrad()
		if _, err := m.Forward(ids, targets); err != nil {
			t.Fatal(err)
		}
		_, g := m.Params().Flat()
		for i, v := range download(t, m.b, g) {
			if v != 0 {
				t.Fatalf("chunk rows %d: gradient %d is %v after a forward without backward", rows, i, v)
			}
		}
	}
}
