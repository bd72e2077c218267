package tp

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// VocabParallelCrossEntropy is softmax cross-entropy over logits split
// along the vocabulary: rank r holds the columns [Lo, Lo+Vocab/P) of the
// (N, Vocab) logits, the output of a column-parallel LM head, and no rank
// ever holds all of them. Per row n, with lse_r the log-sum-exp of rank r's
// columns and o the rank that holds the target t:
//
//	lse_r, ℓ_r = lse_r − x[column]          the backend's CrossEntropy (+ that column's logit)
//	Q[n, :]    = (lse_0, …, lse_{P−1})      all-gather of (lse_r, ℓ_r), then a gather (Embedding)
//	loss       = (LSE(Q) − lse_o) + ℓ_o     the backend's CrossEntropy over Q with target o,
//	           = LSE over the vocabulary − x_t         plus the owner's ℓ_o
//
// all on the device, so the only host read is the caller's (the per-row
// losses stay on the device, the same on every rank of the group; the
// all-gather moves 2N values per rank, like the all-reduces of a max and a
// sum would). The LSE over ranks is the backend's own stable one (the max
// subtracted inside CrossEntropy), so no exp or log is written here. The
// backward is local: ∂loss/∂logits = softmax_r(x)·exp(lse_r − lse) −
// onehot, this rank's columns, where exp(lse_r − lse) = softmax(Q)[n, r]:
// Softmax, a batched matmul that scales each row, and EmbeddingBackward
// (subtracting the one-hot). With one rank it is the backend's fused
// CrossEntropy.
type VocabParallelCrossEntropy struct {
	Vocab, LocalVocab, Lo int // the full vocabulary, this rank's Vocab/P columns, its first column

	b   tensor.Backend
	par Parallel
	// Scratch, reallocated when N changes.
	n     int            // rows the scratch is for
	idx   *tensor.Tensor // (5, N) int32: tgt, gidx, qtgt, oidx, widx (below)
	qidx  *tensor.Tensor // (N·P) int32: Q[n, q] = gathered[q·2N + n]
	xr    *tensor.Tensor // (N, 1) x[local column]
	xr32  *tensor.Tensor // (N) stat: xr in the stat dtype (when it differs)
	send  *tensor.Tensor // (2, N) stat: lse_r, ℓ_r = lse_r − x[local column]
	gath  *tensor.Tensor // (P·2N) stat: every rank's send
	q     *tensor.Tensor // (N, P) stat: lse of every rank
	own   *tensor.Tensor // (N, 1) stat: the owner's ℓ_o
	lossQ *tensor.Tensor // (N) stat: LSE(Q) − lse_o
	smq   *tensor.Tensor // (N·P + 1) stat: softmax(Q), then a 0 for ignored rows
	w     *tensor.Tensor // (N, 1) stat: exp(lse_r − lse), 0 for ignored rows
	scale *tensor.Tensor // (N, 1, 1) w in the logits' dtype (when it differs)
	sm    *tensor.Tensor // (N, 1, V/P) local softmax
	tidx  *tensor.Tensor // (M) int32: flat indices of the local targets
	neg   *tensor.Tensor // (M, 1) −gradScale
}

// NewVocabParallelCrossEntropy returns the loss for a vocabulary of vocab
// ids split over par's TP group (P must divide vocab).
func NewVocabParallelCrossEntropy(b tensor.Backend, par Parallel, vocab int) (*VocabParallelCrossEntropy, error) {
	if b == nil {
		return nil, fmt.Errorf("%s: nil backend", ceWhat)
	}
	if err := par.check(ceWhat); err != nil {
		return nil, err
	}
	lo, hi, err := par.split(ceWhat, "vocab", vocab)
	if err != nil {
		return nil, err
	}
	return &VocabParallelCrossEntropy{Vocab: vocab, LocalVocab: hi - lo, Lo: lo, b: b, par: par}, nil
}

const ceWhat = "tp: vocab-parallel cross-entropy"

// Forward computes the per-row losses of logits (N, Vocab/P), this rank's
// columns, against targets, a host int32 tensor of N values (any shape;
// negative values ignore their row: loss 0, gradient 0). losses, a tensor
// of N elements on the backend in the stat dtype (layerkit.StatDType of the
// logits'), receives the losses, the same on every rank of the group;
// nothing is read back to the host. When dlogits (shaped like logits) is
// not nil it receives gradScale·∂(Σ losses)/∂logits for this rank's
// columns.
func (ce *VocabParallelCrossEntropy) Forward(losses, dlogits, logits, targets *tensor.Tensor, gradScale float32) error {
	b := ce.b
	if logits == nil || !logits.DType().IsFloat() || logits.Device() != b.Device() {
		return fmt.Errorf("%s: logits %v, expected a float tensor on %v", ceWhat, logits, b.Device())
	}
	dt := logits.DType()
	N, err := layerkit.CheckRows(b, ceWhat, "logits", logits, dt, ce.LocalVocab)
	if err != nil {
		return err
	}
	var tv []int32
	if targets != nil {
		tv = targets.I32()
	}
	if tv == nil || len(tv) != N {
		return fmt.Errorf("%s: targets %v, expected a host int32 tensor of %d values (one per row of logits %v)", ceWhat, targets, N, logits.Shape())
	}
	sdt := layerkit.StatDType(dt)
	if err := layerkit.CheckOn(b, ceWhat, "losses", losses, sdt); err != nil {
		return err
	}
	if losses.Numel() != N {
		return fmt.Errorf("%s: losses %v, expected %d values of %v on %v (one per row of logits %v)", ceWhat, losses, N, sdt, b.Device(), logits.Shape())
	}
	if dlogits != nil {
		if err := layerkit.CheckRowsN(b, ceWhat, "dlogits", dlogits, dt, ce.LocalVocab, N, "like logits"); err != nil {
			return err
		}
		if err := layerkit.CheckApart(ceWhat, "dlogits", dlogits, "logits", logits); err != nil {
			return err
		}
	}
	for i, t := range tv {
		if int(t) >= ce.Vocab {
			return fmt.Errorf("%s: targets[%d] = %d, expected a value < Vocab = %d (or negative to ignore it)", ceWhat, i, t, ce.Vocab)
		}
	}
	if err := layerkit.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	x := layerkit.Reshape(logits, N, ce.LocalVocab)
	lv := layerkit.Reshape(losses, N)
	ce.alloc(N, dt)
	if ce.par.Size() == 1 {
		ce.b.Upload(ce.idx, hostI32(tv))
		var d *tensor.Tensor
		if dlogits != nil {
			d = layerkit.Reshape(dlogits, N, ce.LocalVocab)
		}
		b.CrossEntropy(lv, d, x, ce.idx, gradScale)
		return layerkit.Sticky(b, ceWhat, "forward")
	}
	return ce.forwardSplit(lv, dlogits, x, tv, gradScale)
}

func (ce *VocabParallelCrossEntropy) alloc(N int, dt tensor.DType) {
	b, sdt, P := ce.b, layerkit.StatDType(dt), ce.par.Size()
	if P == 1 {
		ce.idx = layerkit.Ensure(b, ce.idx, tensor.Int32, N)
		return
	}
	ce.idx = layerkit.Ensure(b, ce.idx, tensor.Int32, 5, N)
	ce.xr = layerkit.Ensure(b, ce.xr, dt, N, 1)
	if dt != sdt {
		ce.xr32 = layerkit.Ensure(b, ce.xr32, sdt, N)
		ce.scale = layerkit.Ensure(b, ce.scale, dt, N, 1, 1)
	}
	ce.send = layerkit.Ensure(b, ce.send, sdt, 2, N)
	ce.gath = layerkit.Ensure(b, ce.gath, sdt, P*2*N)
	ce.q = layerkit.Ensure(b, ce.q, sdt, N, P)
	ce.own = layerkit.Ensure(b, ce.own, sdt, N, 1)
	ce.lossQ = layerkit.Ensure(b, ce.lossQ, sdt, N)
	ce.w = layerkit.Ensure(b, ce.w, sdt, N, 1)
	if ce.n != N || ce.qidx == nil {
		ce.n = N
		// Q[n, q] is lse_q[n], at q·2N + n of the gathered (P, 2, N).
		qidx := make([]int32, N*P)
		for n := range N {
			for q := range P {
				qidx[n*P+q] = int32(q*2*N + n)
			}
		}
		ce.qidx = layerkit.Ensure(b, ce.qidx, tensor.Int32, N*P)
		b.Upload(ce.qidx, hostI32(qidx))
	}
	// softmax(Q) and one 0 after it (never written), the ignored rows' weight.
	ce.smq = layerkit.Ensure(b, ce.smq, sdt, N*P+1)
}

// row is row i of t, flattened.
func row(t *tensor.Tensor, i int) *tensor.Tensor {
	r, err := t.Rows(i, i+1)
	if err != nil {
		panic("tp: internal error: " + err.Error())
	}
	return layerkit.Reshape(r, r.Numel())
}

// forwardSplit is Forward on P > 1 ranks; losses is (N).
func (ce *VocabParallelCrossEntropy) forwardSplit(losses, dlogits, x *tensor.Tensor, tv []int32, gradScale float32) error {
	b, g, s := ce.b, ce.par.Group, ce.par.Stream
	N, V, P, r := x.Dim(0), ce.LocalVocab, ce.par.Size(), ce.par.Rank()
	dt, sdt := x.DType(), losses.DType()
	// Per row: a local column (the target when this rank has it, else 0,
	// since any column gives lse_r = ℓ_r + x[column]; −1 for ignored rows,
	// whose ℓ_r is then 0), its flat index, the owner o of the target for
	// the CrossEntropy over Q (−1 for ignored rows), where the owner's ℓ_o
	// lies in the gathered buffer (rank 0's 0 for ignored rows), and where
	// this rank's weight softmax(Q)[n, r] lies (the trailing 0 for ignored
	// rows).
	h := make([]int32, 5*N)
	tgt, gidx, qtgt, oidx, widx := h[:N], h[N:2*N], h[2*N:3*N], h[3*N:4*N], h[4*N:]
	var tidx []int32
	for n, t := range tv {
		c, o := int32(0), 0
		if t >= 0 {
			o = int(t) / V // the vocabulary splits evenly (par.split)
		}
		switch l := int(t) - ce.Lo; {
		case t < 0:
			c = -1
		case l >= 0 && l < V:
			c = int32(l)
			tidx = append(tidx, int32(n*V+l))
		}
		tgt[n], gidx[n] = c, int32(n*V+int(max(c, 0)))
		qtgt[n], oidx[n], widx[n] = int32(o), int32(o*2*N+N+n), int32(n*P+r)
		if t < 0 {
			qtgt[n], widx[n] = -1, int32(N*P)
		}
	}
	b.Upload(ce.idx, hostI32(h))
	ix := func(i int) *tensor.Tensor { return row(ce.idx, i) }
	lse, lossR := row(ce.send, 0), row(ce.send, 1)
	b.CrossEntropy(lossR, nil, x, ix(0), 0)                // ℓ_r = lse_r − x[column]
	b.Embedding(ce.xr, layerkit.Reshape(x, N*V, 1), ix(1)) // x[column]
	xr := layerkit.Reshape(ce.xr, N)
	if dt != sdt {
		b.Copy(ce.xr32, xr)
		xr = ce.xr32
	}
	b.Add(lse, lossR, xr) // lse_r
	if err := layerkit.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	w, err := g.AllGather(ce.gath, layerkit.Reshape(ce.send, 2*N), s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("%s forward: all-gather of the row statistics: %w", ceWhat, err)
	}
	table := layerkit.Reshape(ce.gath, P*2*N, 1)
	b.Embedding(layerkit.Reshape(ce.q, N*P, 1), table, ce.qidx) // Q
	b.Embedding(ce.own, table, ix(3))                           // ℓ_o
	b.CrossEntropy(ce.lossQ, nil, ce.q, ix(2), 0)               // LSE(Q) − lse_o
	b.Add(losses, ce.lossQ, layerkit.Reshape(ce.own, N))
	if dlogits == nil {
		return layerkit.Sticky(b, ceWhat, "forward")
	}
	// ∂/∂x = softmax_r(x)·exp(lse_r − lse)·gradScale − onehot·gradScale.
	sq, err := ce.smq.View(0, N, P)
	if err != nil {
		return fmt.Errorf("%s: internal error: %w", ceWhat, err)
	}
	b.Softmax(sq, ce.q)
	b.Embedding(ce.w, layerkit.Reshape(ce.smq, N*P+1, 1), ix(4)) // exp(lse_r − lse)
	scale := layerkit.Reshape(ce.w, N, 1, 1)
	if dt != sdt {
		b.Copy(ce.scale, ce.w)
		scale = ce.scale
	}
	ce.sm = layerkit.Ensure(b, ce.sm, dt, N, 1, V)
	b.Softmax(layerkit.Reshape(ce.sm, N, V), x)
	b.MatMul(layerkit.Reshape(dlogits, N, 1, V), scale, ce.sm, false, false, gradScale, 0) // row n times its weight
	if M := len(tidx); M > 0 {
		ce.tidx = layerkit.Ensure(b, ce.tidx, tensor.Int32, M)
		ce.neg = layerkit.Ensure(b, ce.neg, dt, M, 1)
		b.Upload(ce.tidx, hostI32(tidx))
		b.Fill(ce.neg, -float64(gradScale))
		b.EmbeddingBackward(layerkit.Reshape(dlogits, N*V, 1), ce.neg, ce.tidx) // −gradScale at the targets
	}
	return layerkit.Sticky(b, ceWhat, "forward")
}
