package layers

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/internal/layerkit"
	"github.com/asynctp/asynctp/tensor"
)

// GradSync is told of a Decoder's gradients during its backward passes
// (DecoderParts.Grads): when the backward of each micro-batch of a step
// begins and ends, and, in between, when parameters' gradients are
// complete for the micro-batch, so that the fp32 main gradients can take
// them and, on the step's last micro-batch, their reduction over the
// replicas can start behind the rest of the backward (parallel/grads'
// Reducer; the single-rank GPT's main-gradient accumulation).
type GradSync interface {
	// BeginBackward is called before the backward of micro-batch micro
	// (from 0) of the step's micros.
	BeginBackward(micro, micros int) error
	// Ready says that the backward has written the last of params'
	// gradients of this micro-batch: no later part of it writes them.
	// (A Decoder whose parts do not all list their parameters never
	// calls it: EndBackward then finds every gradient complete.)
	Ready(params []*Param) error
	// EndBackward is called after the backward of the micro-batch, with
	// the backward's error (nil when it succeeded). After a failure it
	// only waits for the work it started and returns failed (the Decoder
	// has already called DecoderParts.Fail, so that peers stop).
	EndBackward(failed error) error
}

// The backward's stages, in their order: the head, the final norm, the
// blocks from the last to the first, the embedding.
const (
	stageHead = 0
	stageNorm = 1
)

func (d *Decoder) stageBlock(l int) int { return 2 + len(d.p.Blocks) - 1 - l }
func (d *Decoder) stageEmbed() int      { return 2 + len(d.p.Blocks) }

// stageReady lists, per backward stage, the parameters whose last
// gradient write is that stage's (a tied embedding's table is written by
// the head and completed by the embedding).
type stageReady struct {
	made   bool
	known  bool       // every part lists its parameters
	params [][]*Param // by stage
}

// paramLister is a part that lists its parameters.
type paramLister interface{ Params() []*Param }

// readyLists returns the parameters each backward stage completes, or
// false when a part does not list its parameters.
func (d *Decoder) readyLists() ([][]*Param, bool) {
	r := &d.ready
	if r.made {
		return r.params, r.known
	}
	r.made = true
	n := d.stageEmbed() + 1
	stages := make([][]*Param, n)
	parts := map[int]any{stageHead: d.p.Head, stageNorm: d.p.Norm, d.stageEmbed(): d.p.Embed}
	for l, blk := range d.p.Blocks {
		parts[d.stageBlock(l)] = blk
	}
	for i := range n {
		pl, ok := parts[i].(paramLister)
		if !ok {
			return nil, false
		}
		stages[i] = pl.Params()
	}
	last := map[*Param]int{}
	for i, ps := range stages {
		for _, p := range ps {
			last[p] = i
		}
	}
	r.params = make([][]*Param, n)
	for i, ps := range stages {
		for _, p := range ps {
			if last[p] == i {
				last[p] = -1 // listed once, even if a stage names it twice
				r.params[i] = append(r.params[i], p)
			}
		}
	}
	r.known = true
	return r.params, true
}

// SetGradSync sets DecoderParts.Grads (a GradSync made after the
// Decoder: the gradient reduction of the parameters it materialized).
func (d *Decoder) SetGradSync(g GradSync) { d.p.Grads = g }

// SetMicroBatches makes each following ForwardBackward run its global
// batch as k micro-batches (k ≥ 1; 1, the default, is one forward and one
// backward).
func (d *Decoder) SetMicroBatches(k int) error {
	if k < 1 {
		return fmt.Errorf("%s: %d micro-batches per step, expected at least 1", d.p.What, k)
	}
	d.micros = k
	return nil
}

// MicroBatches is the number of micro-batches of a ForwardBackward.
func (d *Decoder) MicroBatches() int { return max(d.micros, 1) }

// ForwardBackward is a training step's forward and backward over the
// global batch (ids, targets: host int32 (B, T), as Forward takes them),
// run as MicroBatches micro-batches: micro-batch j is rows
// [j·B/k, (j+1)·B/k) of the global batch, at every layout (each replica
// takes its rows of it, as of a global batch). Each runs its forward,
// then its backward, which adds its gradients (the GradSync, when there
// is one, takes them: main gradients, the reduction over the replicas on
// the last micro-batch). The loss and the gradients are those of one
// batch of all k:
//
//   - every micro-batch's per-row losses are scaled by 1/(the non-ignored
//     targets of the whole global batch), so the accumulated gradient is
//     that of the global batch's mean cross-entropy, and the loss
//     (ReadLoss, LossAsync) is the sum of the micro-batches' loss sums
//     over that count, plus the auxiliary losses;
//   - an MoE block routes, and computes its auxiliary losses, capacity
//     and drops, over each micro-batch's tokens (its whole token group's
//     for an expert-parallel layer); the auxiliary losses enter the step
//     with weight 1/k each, their mean (Megatron-LM's choice: its
//     MoEAuxLossAutoScaler scales each micro-batch's aux-loss gradient by
//     1/num_microbatches), and the statistics combine as MoEStats.Combine
//     says (counts summed, losses averaged). A dense model, or an MoE
//     model with no capacity and no auxiliary losses, gets the gradients
//     of the whole batch in one; an MoE model with them gets the sum of
//     its micro-batches' gradients so weighted.
//
// Backward is not called after it. Input errors (shapes, ids, a batch
// that does not split into k micro-batches or whose micro-batches the
// layout cannot split) are found before any work.
func (d *Decoder) ForwardBackward(ids, targets *tensor.Tensor) error {
	d.canBack, d.lossAt, d.steps = false, lossNone, nil
	k := d.MicroBatches()
	if targets == nil {
		return errors.New(d.p.What + ": ForwardBackward needs targets")
	}
	nT, err := d.check(ids, targets)
	if err != nil {
		return err
	}
	B := ids.Dim(0)
	if B%k != 0 {
		return fmt.Errorf("%s: ids have shape %v: the global batch of %d sequences does not split into %d micro-batches of equal size", d.p.What, ids.Shape(), B, k)
	}
	rows := B / k
	micro := func(t *tensor.Tensor, j int) *tensor.Tensor {
		v, err := t.Rows(j*rows, (j+1)*rows)
		if err != nil {
			panic("layers: internal error: " + err.Error()) // rows divide B
		}
		return v
	}
	if k > 1 && d.p.CheckBatch != nil {
		if err := d.p.CheckBatch("a micro-batch's ids", micro(ids, 0)); err != nil {
			return err
		}
	}
	if err := d.b.Err(); err != nil {
		return d.fail(fmt.Errorf("%s: the backend already holds an error: %w", d.p.What, err))
	}
	d.setAuxWeight(1 / float64(k))
	defer d.setAuxWeight(1)
	steps := make([]func() (float64, []MoEStats, bool, error), 0, k)
	for j := range k {
		if err := d.forward(micro(ids, j), micro(targets, j), nT, false); err != nil {
			return d.fail(err)
		}
		if k > 1 {
			d.lossPart = layerkit.Ensure(d.b, d.lossPart, d.lossSum.DType(), 1)
			if j == 0 {
				d.b.Copy(d.lossPart, d.lossSum)
			} else {
				d.b.Add(d.lossPart, d.lossPart, d.lossSum)
			}
		}
		steps = append(steps, d.blocksStatsAsync())
		if err := d.backwardWith(j, k); err != nil {
			return err
		}
	}
	if k > 1 {
		d.b.Copy(d.lossSum, d.lossPart)
	}
	if d.p.ReduceLoss != nil {
		if err := d.p.ReduceLoss(d.lossSum); err != nil {
			return d.fail(err)
		}
	}
	if err := layerkit.Sticky(d.b, d.p.What, "forward and backward"); err != nil {
		return d.fail(err)
	}
	d.lossAt, d.nTargets = lossOnDevice, nT
	if k > 1 {
		d.steps = steps
	}
	return nil
}

// backwardWith runs the backward of micro-batch j of k with the
// GradSync's calls around it; its errors have gone through fail.
func (d *Decoder) backwardWith(j, k int) error {
	g := d.p.Grads
	if g == nil {
		if err := d.backward(nil); err != nil {
			return d.fail(err)
		}
		return nil
	}
	if err := g.BeginBackward(j, k); err != nil {
		return d.fail(err)
	}
	var done func(int) error
	if lists, ok := d.readyLists(); ok {
		done = func(stage int) error {
			if ps := lists[stage]; len(ps) > 0 {
				return g.Ready(ps)
			}
			return nil
		}
	}
	if err := d.backward(done); err != nil {
		err = d.fail(err)
		return g.EndBackward(err)
	}
	if err := g.EndBackward(nil); err != nil {
		return d.fail(err)
	}
	return nil
}

// AuxWeighter is an optional interface of a feed-forward layer with
// auxiliary losses (an MoE layer): SetAuxWeight(w) multiplies the
// gradient of the auxiliary losses of the following forwards by w (not
// their values), the 1/k of a step of k micro-batches; 1 restores it.
type AuxWeighter interface {
	// SetAuxWeight sets the weight w of the auxiliary losses' gradient.
	SetAuxWeight(w float64)
}

// SetAuxWeight sets the weight of the block's auxiliary losses' gradient
// (AuxWeighter) when its feed-forward layer has one.
func (blk *Block) SetAuxWeight(w float64) {
	if a, ok := blk.FFN.(AuxWeighter); ok {
		a.SetAuxWeight(w)
	}
}

func (d *Decoder) setAuxWeight(w float64) {
	for _, blk := range d.p.Blocks {
		blk.SetAuxWeight(w)
	}
}

// Combine returns the statistics of a step run as micro-batches from each
// micro-batch's statistics of one MoE layer (in micro-batch order): the
// token counts, the token-slots per expert and the drops summed (the
// step's routing: what Megatron-LM sums over micro-batches for its
// tokens-per-expert logging and its expert-bias update), the load balance,
// the z-loss and the auxiliary loss averaged (their weight in the step's
// loss, 1/k each). The name is the first's.
func CombineMoEStats(st []MoEStats) MoEStats {
	if len(st) == 0 {
		return MoEStats{}
	}
	out := MoEStats{Name: st[0].Name}
	for _, s := range st {
		out.Tokens += s.Tokens
		out.Dropped += s.Dropped
		if len(out.TokensPerExpert) < len(s.TokensPerExpert) {
			out.TokensPerExpert = append(out.TokensPerExpert, make([]int, len(s.TokensPerExpert)-len(out.TokensPerExpert))...)
		}
		for e, c := range s.TokensPerExpert {
			out.TokensPerExpert[e] += c
		}
		out.LoadBalance += s.LoadBalance
		out.ZLoss += s.ZLoss
		out.AuxLoss += s.AuxLoss
	}
	k := float64(len(st))
	out.LoadBalance /= k
	out.ZLoss /= k
	out.AuxLoss /= k
	return out
}

// combineSteps is RouterStatsAsync over the micro-batches of a step.
func combineSteps(steps []func() (float64, []MoEStats, bool, error)) func() (float64, []MoEStats, error) {
	return func() (float64, []MoEStats, error) {
		var aux float64
		var per [][]MoEStats // by block, by micro-batch
		for _, read := range steps {
			a, st, moe, err := read()
			if err != nil {
				return 0, nil, err
			}
			aux += a
			if !moe {
				continue
			}
			if per == nil {
				per = make([][]MoEStats, len(st))
			}
			for i, s := range st {
				per[i] = append(per[i], s)
			}
		}
		var stats []MoEStats
		for _, st := range per {
			stats = append(stats, CombineMoEStats(st))
		}
		return aux / float64(len(steps)), stats, nil
	}
}
