package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// TokenEmbedding is the first part of a Decoder: the rows of the residual
// stream from token ids.
type TokenEmbedding interface {
	// Forward writes out (n, Dim) from ids, a host int32 (B, T) tensor of
	// N = B·T tokens (n = N, or this rank's tokens under sequence
	// parallelism).
	Forward(out, ids *tensor.Tensor) error
	// Backward adds the table's gradient from dout, shaped like out.
	Backward(dout *tensor.Tensor) error
}

// Projection is the LM head of a Decoder: y (N, logit columns) from x, the
// rows of the final norm.
type Projection interface {
	// Forward writes y from x and keeps x for the backward.
	Forward(y, x *tensor.Tensor) error
	// Backward overwrites dx with ∂L/∂x and adds the weights' gradients,
	// from dy.
	Backward(dx, dy *tensor.Tensor) error
}

// Loss is the last part of a Decoder (CrossEntropy here; the
// vocab-parallel cross-entropy of parallel/tp): per-row losses of logits
// against host int32 targets (negative ones ignored), written into losses
// (N values on the device, StatDType of the logits'), and, when dlogits is
// not nil, gradScale·∂(Σ losses)/∂logits into dlogits, without reading
// anything back to the host.
type Loss interface {
	// Forward writes losses (and dlogits when not nil) as above.
	Forward(losses, dlogits, logits, targets *tensor.Tensor, gradScale float32) error
}

// DecoderParts are the parts and hooks of a Decoder. The parts are
// required; a nil hook means the single-rank behaviour.
type DecoderParts struct {
	// What begins the errors ("layers: gpt", "model").
	What string
	// Seq, Vocab and Dim are the model's sizes; LogitCols is the width
	// of the head's output on this rank (Vocab, or Vocab/P).
	Seq, Vocab, Dim, LogitCols int
	DType                      tensor.DType // the dtype of the activations (the parameters')

	Embed  TokenEmbedding // the token embedding
	Blocks []*Block       // the blocks, in order
	Norm   *RMSNorm       // the final norm
	Head   Projection     // the LM head
	Loss   Loss           // the loss of the head's logits
	// HeadLoss, when set, replaces Head then Loss on a forward with
	// targets (ChunkedHeadLoss: the logits never whole in memory); Logits
	// then computes the logits on demand with Head.
	HeadLoss HeadLoss

	// CheckBatch checks host int32 ids or targets (B, T) further, after
	// CheckTokens (what names the tensor): the layout's divisibility.
	CheckBatch func(what string, t *tensor.Tensor) error
	// Replica returns the rows [lo, hi) of a global batch of batch
	// sequences that this replica takes (data parallelism); nil: all.
	Replica func(batch int) (lo, hi int)
	// Rows returns the rows of the residual stream this rank holds of a
	// replica's tokens (sequence parallelism); nil: all.
	Rows func(tokens int) (int, error)
	// ReduceLoss sums the (1) loss sum over the replicas, in place on the
	// device (an all-reduce over the DP group); nil: one replica.
	ReduceLoss func(sum *tensor.Tensor) error
	// Fail is called on every error after the inputs have been validated
	// (an abort of the world, so that the other ranks stop) and returns
	// the error to return; nil returns it as it is.
	Fail func(error) error
	// Grads is told, in ForwardBackward, when the backward of each
	// micro-batch begins and ends and when parameters' gradients are
	// complete (GradSync: the fp32 main gradients' accumulation, the
	// reduction over the replicas behind the backward); nil: the
	// gradients stay where the backward adds them.
	Grads GradSync
}

// Decoder is the GPT assembly, one for the single-rank GPT and the
// sharded model: token embedding → blocks → final RMSNorm → LM head →
// per-row losses, from parts (DecoderParts). GPT is a Decoder of this
// package's layers; parallel/model's Model is a Decoder of vocab-parallel,
// tensor-parallel and expert-parallel parts with hooks for the replica's
// rows, the token shard, the loss all-reduce and failure handling.
//
// Its loss is the mean cross-entropy over the non-ignored targets of the
// (global) batch plus the blocks' auxiliary losses. The per-row losses are
// summed on the device and stay there until ReadLoss, so a Backward queues
// behind ForwardAsync with no host sync in between.
type Decoder struct {
	p DecoderParts
	b tensor.Backend

	// Activations of the last Forward (reallocated when B or T change).
	bt       [2]int           // this replica's B and T
	xs       []*tensor.Tensor // Layers+1 of (n, C): the residual stream
	hf       *tensor.Tensor   // (n, C) final norm output
	logits   *tensor.Tensor   // (N, LogitCols)
	dlogits  *tensor.Tensor   // (N, LogitCols) gradScale·∂loss/∂logits
	losses   *tensor.Tensor   // (N) stat dtype: per-row losses
	lossSum  *tensor.Tensor   // (1) stat dtype: their sum over the global batch
	dhf      *tensor.Tensor   // (n, C) backward scratch
	dxa, dxb *tensor.Tensor   // (n, C) backward scratch
	nTargets int              // non-ignored targets of the last Forward's batch
	lossAt   int              // where the last Forward's loss is (lossNone, ...)
	canBack  bool             // a Forward with targets ran and no Backward since

	headLoss    bool // the last forward ran HeadLoss: dhf holds the head's input gradient
	logitsStale bool // ... and logits were not computed (Logits computes them)

	micros    int                                         // micro-batches per ForwardBackward (SetMicroBatches; 0: 1)
	lossPart  *tensor.Tensor                              // (1) stat dtype: a micro-batch's loss sum
	steps     []func() (float64, []MoEStats, bool, error) // the last ForwardBackward's micro-batches' statistics (nil after a Forward)
	ready     stageReady                                  // which parameters each backward stage completes (micro.go)
	recompute Recompute                                   // what the blocks' forwards keep (SetRecompute)
}

// Where the loss of the last forward is.
const (
	lossNone     = iota // no successful forward
	lossZero            // a forward without targets: 0
	lossOnDevice        // Σ losses in lossSum, over nTargets targets
)

// NewDecoder returns the assembly of parts on b. It allocates nothing
// until the first Forward.
func NewDecoder(b tensor.Backend, parts DecoderParts) (*Decoder, error) {
	what := parts.What
	if b == nil {
		return nil, fmt.Errorf("%s: NewDecoder with a nil backend", what)
	}
	if parts.Embed == nil || parts.Norm == nil || parts.Head == nil || parts.Loss == nil {
		return nil, fmt.Errorf("%s: decoder parts without an embedding, final norm, head or loss, expected all four", what)
	}
	for i, blk := range parts.Blocks {
		if blk == nil {
			return nil, fmt.Errorf("%s: decoder block %d is nil", what, i)
		}
	}
	if parts.Seq <= 0 || parts.Vocab <= 0 || parts.Dim <= 0 || parts.LogitCols <= 0 || !parts.DType.IsFloat() {
		return nil, fmt.Errorf("%s: decoder sizes Seq %d, Vocab %d, Dim %d, LogitCols %d, dtype %v, expected positive sizes and a float dtype",
			what, parts.Seq, parts.Vocab, parts.Dim, parts.LogitCols, parts.DType)
	}
	if parts.HeadLoss != nil && parts.Rows != nil {
		return nil, fmt.Errorf("%s: decoder parts with a HeadLoss and a Rows hook: the fused head takes every row of the replica", what)
	}
	return &Decoder{p: parts, b: b}, nil
}

// Logits returns the (N, LogitCols) logits of the last Forward (nil before
// the first); they stay valid until the next Forward. After a forward with
// targets through HeadLoss the logits were never stored whole: the first
// call computes them from the kept final-norm rows (one head GEMM).
func (d *Decoder) Logits() *tensor.Tensor {
	if d.logitsStale {
		d.logitsStale = false
		d.logits = layerkit.Ensure(d.b, d.logits, d.p.DType, d.bt[0]*d.bt[1], d.p.LogitCols)
		if err := d.p.Head.Forward(d.logits, d.hf); err != nil {
			return nil
		}
	}
	return d.logits
}

func (d *Decoder) fail(err error) error {
	if d.p.Fail != nil {
		return d.p.Fail(err)
	}
	return err
}

// Forward runs the model on ids (host int32 (B, T), T ≤ Seq, each id in
// [0, Vocab)) and, when targets (host int32 (B, T); negative values are
// ignored) is not nil, returns the mean cross-entropy over the non-ignored
// targets plus the blocks' auxiliary losses (AuxLoss) and prepares the
// gradient of that sum for Backward. With nil targets the loss is 0 and
// Backward is not allowed. It is ForwardAsync then ReadLoss.
func (d *Decoder) Forward(ids, targets *tensor.Tensor) (float64, error) {
	if err := d.ForwardAsync(ids, targets); err != nil {
		return 0, err
	}
	return d.ReadLoss()
}

// check validates ids and targets and returns how many targets are not
// ignored.
func (d *Decoder) check(ids, targets *tensor.Tensor) (int, error) {
	what := d.p.What
	checkTokens := func(name string, t *tensor.Tensor) error {
		if err := layerkit.CheckTokens(what, name, t, d.p.Seq); err != nil {
			return err
		}
		if d.p.CheckBatch != nil {
			return d.p.CheckBatch(name, t)
		}
		return nil
	}
	if err := checkTokens("ids", ids); err != nil {
		return 0, err
	}
	if err := layerkit.CheckIDs(what+": ids", ids, d.p.Vocab); err != nil {
		return 0, err
	}
	if targets == nil {
		return 0, nil
	}
	if err := checkTokens("targets", targets); err != nil {
		return 0, err
	}
	return layerkit.CountTargets(what, targets, ids, d.p.Vocab)
}

// ForwardAsync is Forward without reading the loss back: the per-row
// losses are summed on the device (then over the replicas, ReduceLoss)
// and stay there until ReadLoss, so a Backward queues behind the forward
// with no host sync in between. Input errors are found before any op.
func (d *Decoder) ForwardAsync(ids, targets *tensor.Tensor) error {
	d.canBack, d.lossAt, d.steps = false, lossNone, nil
	nTargets, err := d.check(ids, targets)
	if err != nil {
		return err
	}
	if err := d.b.Err(); err != nil {
		return d.fail(fmt.Errorf("%s: the backend already holds an error: %w", d.p.What, err))
	}
	if err := d.forward(ids, targets, nTargets, true); err != nil {
		return d.fail(err)
	}
	d.canBack = targets != nil
	return nil
}

// forward runs the model on ids and, with targets, forms the per-row
// losses scaled for the backward by 1/nTargets and their sum in lossSum,
// over the replicas when reduce (else this replica's only).
func (d *Decoder) forward(ids, targets *tensor.Tensor, nTargets int, reduce bool) error {
	what := d.p.What
	lo, hi := 0, ids.Dim(0)
	if d.p.Replica != nil {
		lo, hi = d.p.Replica(ids.Dim(0))
	}
	B, T := hi-lo, ids.Dim(1)
	N := B * T
	if err := d.alloc(B, T); err != nil {
		return err
	}
	myIDs, err := ids.Rows(lo, hi)
	if err != nil {
		return err
	}
	if err := d.p.Embed.Forward(d.xs[0], myIDs); err != nil {
		return err
	}
	for l, blk := range d.p.Blocks {
		if err := blk.ForwardSeq(d.xs[l+1], d.xs[l], B, T); err != nil {
			return err
		}
	}
	if err := d.p.Norm.Forward(d.hf, d.xs[len(d.p.Blocks)]); err != nil {
		return err
	}
	d.headLoss, d.logitsStale = false, false
	if targets == nil || d.p.HeadLoss == nil {
		d.logits = layerkit.Ensure(d.b, d.logits, d.p.DType, N, d.p.LogitCols)
		if err := d.p.Head.Forward(d.logits, d.hf); err != nil {
			return err
		}
	}
	if targets == nil {
		d.lossAt = lossZero
		return layerkit.Sticky(d.b, what, "forward")
	}
	scale := float32(0)
	if nTargets > 0 {
		scale = float32(1 / float64(nTargets))
	}
	myTargets, err := targets.Rows(lo, hi)
	if err != nil {
		return err
	}
	if d.p.HeadLoss != nil {
		// The head and the loss by chunks: dhf is ready for the backward.
		if err := d.p.HeadLoss.ForwardLoss(d.losses, d.dhf, d.hf, myTargets, scale); err != nil {
			return err
		}
		d.headLoss, d.logitsStale = true, true
	} else {
		d.dlogits = layerkit.Ensure(d.b, d.dlogits, d.p.DType, N, d.p.LogitCols)
		if err := d.p.Loss.Forward(d.losses, d.dlogits, d.logits, myTargets, scale); err != nil {
			return err
		}
	}
	// The sum of the losses, on the device: over this replica's rows,
	// then over the replicas.
	d.b.Fill(d.lossSum, 0)
	d.b.SumRows(d.lossSum, layerkit.Reshape(d.losses, N, 1))
	if err := layerkit.Sticky(d.b, what, "forward"); err != nil {
		return err
	}
	if d.p.ReduceLoss != nil && reduce {
		if err := d.p.ReduceLoss(d.lossSum); err != nil {
			return err
		}
		if err := layerkit.Sticky(d.b, what, "forward"); err != nil {
			return err
		}
	}
	d.lossAt, d.nTargets = lossOnDevice, nTargets
	return nil
}

// alloc (re)allocates the activations for a replica batch of B sequences
// of T tokens.
func (d *Decoder) alloc(B, T int) error {
	if d.bt == [2]int{B, T} {
		return nil
	}
	b, dt, C := d.b, d.p.DType, d.p.Dim
	N := B * T
	n := N
	if d.p.Rows != nil {
		var err error
		if n, err = d.p.Rows(N); err != nil {
			return err
		}
	}
	if d.xs == nil {
		d.xs = make([]*tensor.Tensor, len(d.p.Blocks)+1)
	}
	for i := range d.xs {
		d.xs[i] = layerkit.Ensure(b, d.xs[i], dt, n, C)
	}
	d.hf = layerkit.Ensure(b, d.hf, dt, n, C)
	// logits and dlogits (N, LogitCols) are allocated by forward, only
	// where a path needs them whole.
	d.losses = layerkit.Ensure(b, d.losses, layerkit.StatDType(dt), N)
	d.lossSum = layerkit.Ensure(b, d.lossSum, layerkit.StatDType(dt), 1)
	d.dhf = layerkit.Ensure(b, d.dhf, dt, n, C)
	d.dxa = layerkit.Ensure(b, d.dxa, dt, n, C)
	d.dxb = layerkit.Ensure(b, d.dxb, dt, n, C)
	d.bt = [2]int{B, T}
	return nil
}

// ReadLoss returns the loss of the last ForwardAsync (what Forward
// returns), reading one scalar from the device: it waits for the work
// queued before it, so read it after Backward to keep the two back to
// back. It involves no other rank and may be called more than once.
func (d *Decoder) ReadLoss() (float64, error) {
	switch d.lossAt {
	case lossNone:
		return 0, errors.New(d.p.What + ": ReadLoss needs a successful Forward first")
	case lossZero:
		return 0, nil
	}
	h := tensor.MustHost(tensor.Float64, 1)
	d.b.Download(h, d.lossSum)
	if err := layerkit.Sticky(d.b, d.p.What, "reading the loss"); err != nil {
		return 0, d.fail(err)
	}
	if d.nTargets == 0 {
		return d.AuxLoss(), nil
	}
	return h.F64()[0]/float64(d.nTargets) + d.AuxLoss(), nil
}

// LossAsync is ReadLoss without the wait: it queues the read of the loss
// sum (tensor.ReadAsync: on a GPU a copy into pinned memory after the work
// queued so far) and returns a function that waits for that copy only and
// returns what ReadLoss would have returned now. The target count is
// taken now and the auxiliary losses with RouterStatsAsync (an MoE block's
// still on the device are waited for by the function, not now), so later
// forwards do not change the result: a training loop can queue the next
// step before it reads this one's loss. The returned function may be
// called once.
func (d *Decoder) LossAsync() (func() (float64, error), error) {
	switch d.lossAt {
	case lossNone:
		return nil, errors.New(d.p.What + ": LossAsync needs a successful Forward first")
	case lossZero:
		return func() (float64, error) { return 0, nil }, nil
	}
	auxOf, n := d.RouterStatsAsync(), d.nTargets
	readAux := func() (float64, error) {
		aux, _, err := auxOf()
		if err != nil {
			return 0, d.fail(fmt.Errorf("%s: reading the auxiliary losses: %w", d.p.What, err))
		}
		return aux, nil
	}
	if n == 0 {
		return readAux, nil
	}
	r := tensor.ReadAsync(d.b, d.lossSum)
	return func() (float64, error) {
		vals, err := r.Wait()
		if err != nil {
			return 0, d.fail(fmt.Errorf("%s: reading the loss: %w", d.p.What, err))
		}
		aux, err := readAux()
		if err != nil {
			return 0, err
		}
		return vals[0]/float64(n) + aux, nil
	}, nil
}

// AuxLoss is the sum of the blocks' auxiliary losses (the MoE blocks'
// load balance and z-loss, with their coefficients) of the last Forward:
// the part of Forward's loss that is not the cross-entropy. 0 in a dense
// model.
//
// After a ForwardBackward of several micro-batches it is the mean of the
// micro-batches' (the value they add to the step's loss; see
// ForwardBackward), 0 if their statistics cannot be read.
func (d *Decoder) AuxLoss() float64 {
	if d.steps != nil {
		aux, _, _ := d.RouterStatsAsync()()
		return aux
	}
	var s float64
	for _, blk := range d.p.Blocks {
		s += blk.AuxLoss()
	}
	return s
}

// RouterStats returns the routing statistics of the last Forward, one per
// MoE block in block order (nil in a dense model); after a
// ForwardBackward, those of its micro-batches combined (MoEStats.Combine;
// nil if they cannot be read).
func (d *Decoder) RouterStats() []MoEStats {
	if d.steps != nil {
		_, st, _ := d.RouterStatsAsync()()
		return st
	}
	var st []MoEStats
	for _, blk := range d.p.Blocks {
		if s, ok := blk.Stats(); ok {
			st = append(st, s)
		}
	}
	return st
}

// Backward adds the gradient of the last Forward's mean loss to the
// parameters' gradients (of this replica's rows: the caller reduces them
// over the replicas), a step of one micro-batch for the GradSync when
// there is one (DecoderParts.Grads). It requires a Forward with targets,
// and runs once per Forward.
func (d *Decoder) Backward() error {
	if !d.canBack {
		return errors.New(d.p.What + ": Backward needs a successful Forward with targets since the last Backward")
	}
	d.canBack = false
	return d.backwardWith(0, 1)
}

// backward runs the backward of the last forward, in the order of its
// stages (stageHead, stageNorm, the blocks from the last, stageEmbed),
// calling done after each with the stage's index when done is not nil.
func (d *Decoder) backward(done func(stage int) error) error {
	if done == nil {
		done = func(int) error { return nil }
	}
	if d.headLoss {
		if err := d.p.HeadLoss.AddGrads(); err != nil { // dhf came with the forward
			return err
		}
	} else if err := d.p.Head.Backward(d.dhf, d.dlogits); err != nil {
		return err
	}
	if err := done(stageHead); err != nil {
		return err
	}
	dx, dnext := d.dxa, d.dxb
	if err := d.p.Norm.Backward(dx, d.dhf); err != nil {
		return err
	}
	if err := done(stageNorm); err != nil {
		return err
	}
	last := len(d.p.Blocks) - 1
	for l := last; l >= 0; l-- {
		if d.recompute == RecomputeBlock && l < last {
			// The block's forward again, from its kept input: its
			// activations, and the output (the same bits), which goes
			// where it went.
			B, T := d.bt[0], d.bt[1]
			if err := d.p.Blocks[l].ForwardSeq(d.xs[l+1], d.xs[l], B, T); err != nil {
				return err
			}
		}
		if err := d.p.Blocks[l].Backward(dnext, dx); err != nil {
			return err
		}
		if err := done(d.stageBlock(l)); err != nil {
			return err
		}
		dx, dnext = dnext, dx
	}
	if err := d.p.Embed.Backward(dx); err != nil {
		return err
	}
	if err := done(d.stageEmbed()); err != nil {
		return err
	}
	return layerkit.Sticky(d.b, d.p.What, "backward")
}

// CrossEntropy is the plain Loss part: the backend's fused softmax
// cross-entropy of (N, Vocab) logits against host int32 targets.
type CrossEntropy struct {
	Vocab int // the logits' columns

	b       tensor.Backend
	targets *tensor.Tensor // (N) int32 on the device
}

// NewCrossEntropy returns the loss over a vocabulary of vocab ids on b.
func NewCrossEntropy(b tensor.Backend, vocab int) (*CrossEntropy, error) {
	if b == nil || vocab <= 0 {
		return nil, fmt.Errorf("layers: cross-entropy: backend %v, vocab %d, expected a backend and a positive vocab", b, vocab)
	}
	return &CrossEntropy{Vocab: vocab, b: b}, nil
}

const ceWhat = "layers: cross-entropy"

// Forward is Loss.Forward: losses (N values, StatDType of the logits') and,
// when dlogits is not nil, gradScale·∂(Σ losses)/∂logits, from logits
// (N, Vocab) and targets, a host int32 tensor of N values (negative ones
// ignore their row: loss 0, gradient 0).
func (ce *CrossEntropy) Forward(losses, dlogits, logits, targets *tensor.Tensor, gradScale float32) error {
	b := ce.b
	if logits == nil || !logits.DType().IsFloat() {
		return fmt.Errorf("%s: logits %v, expected a float tensor on %v", ceWhat, logits, b.Device())
	}
	dt := logits.DType()
	N, err := layerkit.CheckRows(b, ceWhat, "logits", logits, dt, ce.Vocab)
	if err != nil {
		return err
	}
	if targets == nil || targets.I32() == nil || targets.Numel() != N {
		return fmt.Errorf("%s: targets %v, expected a host int32 tensor of %d values (one per row of logits %v)", ceWhat, targets, N, logits.Shape())
	}
	for i, t := range targets.I32() {
		if int(t) >= ce.Vocab {
			return fmt.Errorf("%s: targets[%d] = %d, expected a value < Vocab = %d (or negative to ignore it)", ceWhat, i, t, ce.Vocab)
		}
	}
	sdt := layerkit.StatDType(dt)
	if err := layerkit.CheckOn(b, ceWhat, "losses", losses, sdt); err != nil {
		return err
	}
	if losses.Numel() != N {
		return fmt.Errorf("%s: losses %v, expected %d values (one per row of logits %v)", ceWhat, losses, N, logits.Shape())
	}
	var d *tensor.Tensor
	if dlogits != nil {
		if err := layerkit.CheckRowsN(b, ceWhat, "dlogits", dlogits, dt, ce.Vocab, N, "like logits"); err != nil {
			return err
		}
		if err := layerkit.CheckApart(ceWhat, "dlogits", dlogits, "logits", logits); err != nil {
			return err
		}
		d = layerkit.Reshape(dlogits, N, ce.Vocab)
	}
	if err := layerkit.Sticky(b, ceWhat, "forward"); err != nil {
		return err
	}
	ce.targets = layerkit.Ensure(b, ce.targets, tensor.Int32, N)
	b.Upload(ce.targets, layerkit.Reshape(targets, N))
	b.CrossEntropy(layerkit.Reshape(losses, N), d, layerkit.Reshape(logits, N, ce.Vocab), ce.targets, gradScale)
	return layerkit.Sticky(b, ceWhat, "forward")
}

// hostIDs is the plain TokenEmbedding part: Embedding on host ids, which
// it uploads.
type hostIDs struct {
	e   *Embedding
	b   tensor.Backend
	ids *tensor.Tensor // (B, T) int32 on the device
}

func (h *hostIDs) Forward(out, ids *tensor.Tensor) error {
	if ids == nil || ids.I32() == nil || len(ids.Shape()) == 0 {
		return fmt.Errorf("%s: ids %v, expected a host int32 tensor (B, T)", h.e.what(), ids)
	}
	if err := layerkit.CheckRowsN(h.b, h.e.what(), "output", out, h.e.W.W.DType(), h.e.Dim, ids.Numel(), "one per id"); err != nil {
		return err
	}
	h.ids = layerkit.Ensure(h.b, h.ids, tensor.Int32, ids.Shape()...)
	h.b.Upload(h.ids, ids)
	return h.e.Forward(layerkit.Reshape(out, append(ids.Shape().Clone(), h.e.Dim)...), h.ids)
}

func (h *hostIDs) Backward(dout *tensor.Tensor) error { return h.e.Backward(dout) }

func (h *hostIDs) Params() []*Param { return h.e.Params() }
