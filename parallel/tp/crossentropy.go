package tp

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// VocabParallelCrossEntropy is softmax cross-entropy over logits split
// along the vocabulary: rank r holds the columns [Lo, Lo+Vocab/P) of the
// (N, Vocab) logits, the output of a column-parallel LM head, and no rank
// ever holds all of them. Per row n, with lse_r the log-sum-exp of rank r's
// columns:
//
//	m      = max_r lse_r                       all-reduce (max)
//	S      = Σ_r exp(lse_r − m)                all-reduce (sum), together with
//	x_t    = the target's logit (one rank has it, the others add 0)
//	loss   = m + log S − x_t
//
// and the backward is local: ∂loss/∂logits = exp(logits − lse) − onehot,
// this rank's columns only. The per-row work on the backend is its own
// CrossEntropy (which gives lse_r − x of a chosen local column), Embedding
// on a view of the logits (that column's value), Softmax, a batched matmul
// that scales each row, and EmbeddingBackward (subtracting the one-hot);
// the few per-row scalars (exp, log) are computed on the host, where the
// losses go anyway. With one rank it is the backend's fused CrossEntropy.
type VocabParallelCrossEntropy struct {
	Vocab, LocalVocab, Lo int

	b   tensor.Backend
	par Parallel
	// Scratch, reallocated when N changes.
	tgt   *tensor.Tensor // (N) int32: local target column (0 for remote targets, −1 ignored)
	gidx  *tensor.Tensor // (N) int32: index of that column in the flat logits
	lossR *tensor.Tensor // (N) lse_r − x[local column], stat dtype
	xr    *tensor.Tensor // (N, 1) x[local column]
	mx    *tensor.Tensor // (N) stat: lse_r, then m
	sums  *tensor.Tensor // (2, N) stat: Σ exp(lse_r − m) and the target logit
	sm    *tensor.Tensor // (N, 1, V/P) local softmax
	scale *tensor.Tensor // (N, 1, 1) per-row factor of the gradient
	tidx  *tensor.Tensor // (M) int32: flat indices of the local targets
	neg   *tensor.Tensor // (M, 1) −gradScale
	hostA *tensor.Tensor // (N) f64
	hostB *tensor.Tensor // (2, N) f64
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
// negative values ignore their row: loss 0, gradient 0). losses, a host
// Float64 tensor of N elements, receives the losses, the same on every rank
// of the group. When dlogits (shaped like logits) is not nil it receives
// gradScale·∂(Σ losses)/∂logits for this rank's columns.
func (ce *VocabParallelCrossEntropy) Forward(losses, dlogits, logits, targets *tensor.Tensor, gradScale float32) error {
	b := ce.b
	if logits == nil || !logits.DType().IsFloat() || logits.Device() != b.Device() {
		return fmt.Errorf("%s: logits %v, expected a float tensor on %v", ceWhat, logits, b.Device())
	}
	dt := logits.DType()
	N, err := layers.CheckRows(b, ceWhat, "logits", logits, dt, ce.LocalVocab)
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
	var lv []float64
	if losses != nil {
		lv = losses.F64()
	}
	if lv == nil || len(lv) != N {
		return fmt.Errorf("%s: losses %v, expected a host f64 tensor of %d values", ceWhat, losses, N)
	}
	if dlogits != nil {
		if err := layers.CheckRowsN(b, ceWhat, "dlogits", dlogits, dt, ce.LocalVocab, N, "like logits"); err != nil {
			return err
		}
		if err := layers.CheckApart(ceWhat, "dlogits", dlogits, "logits", logits); err != nil {
			return err
		}
	}
	for i, t := range tv {
		if int(t) >= ce.Vocab {
			return fmt.Errorf("%s: targets[%d] = %d, expected a value < Vocab = %d (or negative to ignore it)", ceWhat, i, t, ce.Vocab)
		}
	}
	if err := layers.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	x := layers.Reshape(logits, N, ce.LocalVocab)
	ce.alloc(N, dt)
	if ce.par.Size() == 1 {
		ce.b.Upload(ce.tgt, hostI32(tv))
		var d *tensor.Tensor
		if dlogits != nil {
			d = layers.Reshape(dlogits, N, ce.LocalVocab)
		}
		b.CrossEntropy(ce.lossR, d, x, ce.tgt, gradScale)
		b.Download(losses, ce.lossR)
		return layers.Sticky(b, ceWhat, "forward")
	}
	return ce.forwardSplit(lv, dlogits, x, tv, gradScale)
}

func (ce *VocabParallelCrossEntropy) alloc(N int, dt tensor.DType) {
	b, sdt := ce.b, layers.StatDType(dt)
	ce.tgt = layers.Ensure(b, ce.tgt, tensor.Int32, N)
	ce.lossR = layers.Ensure(b, ce.lossR, sdt, N)
	if ce.par.Size() == 1 {
		return
	}
	ce.gidx = layers.Ensure(b, ce.gidx, tensor.Int32, N)
	ce.xr = layers.Ensure(b, ce.xr, dt, N, 1)
	ce.mx = layers.Ensure(b, ce.mx, sdt, N)
	ce.sums = layers.Ensure(b, ce.sums, sdt, 2, N)
	ce.hostA = tensor.MustHost(tensor.Float64, N)
	ce.hostB = tensor.MustHost(tensor.Float64, 2, N)
}

// forwardSplit is Forward on P > 1 ranks.
func (ce *VocabParallelCrossEntropy) forwardSplit(losses []float64, dlogits, x *tensor.Tensor, tv []int32, gradScale float32) error {
	b, g, s := ce.b, ce.par.Group, ce.par.Stream
	N, V := x.Dim(0), ce.LocalVocab
	dt := x.DType()
	// Per row, a local column: the target when this rank has it, else 0
	// (any column gives lse_r = loss + x[column]); −1 for ignored rows.
	tgt := make([]int32, N)
	gidx := make([]int32, N)
	var tidx []int32
	local := make([]bool, N)
	for n, t := range tv {
		c := int32(0)
		switch l := int(t) - ce.Lo; {
		case t < 0:
			c = -1
		case l >= 0 && l < V:
			c, local[n] = int32(l), true
			tidx = append(tidx, int32(n*V+l))
		}
		tgt[n], gidx[n] = c, int32(n*V+int(max(c, 0)))
	}
	b.Upload(ce.tgt, hostI32(tgt))
	b.Upload(ce.gidx, hostI32(gidx))
	b.CrossEntropy(ce.lossR, nil, x, ce.tgt, 0)            // lse_r − x[column]
	b.Embedding(ce.xr, layers.Reshape(x, N*V, 1), ce.gidx) // x[column]
	b.Download(ce.hostA, ce.lossR)
	xr := tensor.MustHost(tensor.Float64, N)
	b.Download(xr, layers.Reshape(ce.xr, N))
	if err := layers.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	lse := ce.hostA.F64()
	for n, v := range xr.F64() {
		lse[n] += v // lse_r
	}
	// m = max over ranks of lse_r.
	b.Upload(ce.mx, ce.hostA)
	if err := layers.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	if err := wait(s)(g.AllReduce(ce.mx, comm.Max, s)); err != nil {
		return fmt.Errorf("%s forward: %w", ceWhat, err)
	}
	m := tensor.MustHost(tensor.Float64, N)
	b.Download(m, ce.mx)
	// Σ_r exp(lse_r − m) and the target logit, in one all-reduce.
	hb := ce.hostB.F64()
	for n := range N {
		hb[n] = math.Exp(lse[n] - m.F64()[n])
		hb[N+n] = 0
		if local[n] {
			hb[N+n] = xr.F64()[n]
		}
	}
	b.Upload(ce.sums, ce.hostB)
	if err := layers.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	if err := wait(s)(g.AllReduce(ce.sums, comm.Sum, s)); err != nil {
		return fmt.Errorf("%s forward: %w", ceWhat, err)
	}
	b.Download(ce.hostB, ce.sums)
	if err := layers.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	scale := make([]float64, N) // exp(lse_r − lse)·gradScale
	for n, t := range tv {
		if t < 0 {
			losses[n] = 0
			continue
		}
		full := m.F64()[n] + math.Log(hb[n])
		losses[n] = full - hb[N+n]
		scale[n] = math.Exp(lse[n]-full) * float64(gradScale)
	}
	if dlogits == nil {
		return nil
	}
	// ∂/∂x = softmax_r(x)·exp(lse_r − lse)·gradScale − onehot·gradScale.
	ce.sm = layers.Ensure(b, ce.sm, dt, N, 1, V)
	ce.scale = layers.Ensure(b, ce.scale, dt, N, 1, 1)
	b.Softmax(layers.Reshape(ce.sm, N, V), x)
	st := tensor.MustHost(tensor.Float64, N, 1, 1)
	copy(st.F64(), scale)
	b.Upload(ce.scale, st)
	b.MatMul(layers.Reshape(dlogits, N, 1, V), ce.scale, ce.sm, false, false, 1, 0) // row n times scale[n]
	if M := len(tidx); M > 0 {
		ce.tidx = layers.Ensure(b, ce.tidx, tensor.Int32, M)
		ce.neg = layers.Ensure(b, ce.neg, dt, M, 1)
		b.Upload(ce.tidx, hostI32(tidx))
		b.Fill(ce.neg, -float64(gradScale))
		b.EmbeddingBackward(layers.Reshape(dlogits, N*V, 1), ce.neg, ce.tidx) // −gradScale at the targets
	}
	return layers.Sticky(b, ceWhat, "forward")
}
