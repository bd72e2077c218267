package model

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
)

// Block is one transformer block of the sharded model: a dense *tp.Block,
// or an *MoEBlock.
type Block interface {
	// Forward writes out from x, both (B·T, Dim) — (B·T/TP, Dim) under
	// sequence parallelism.
	Forward(out, x *tensor.Tensor, batch, seq int) error
	// Backward overwrites dx with ∂L/∂x and adds the parameters'
	// gradients, from dout.
	Backward(dx, dout *tensor.Tensor) error
	// Shards describes the block's parameters.
	Shards() []shard.Shard
}

// MoEBlock is the shared layers.Block with an MoE layer: a tp.Block
// (tensor-parallel attention) whose feed-forward part is the
// expert-parallel MoE of parallel/ep,
//
//	x1  = x + attn(norm1(x))
//	out = x1 + moe(norm2(x1))
//
// The EP layer needs each rank of its group to bring different tokens.
// Under sequence parallelism the TP ranks already hold different tokens
// (N/TP rows each). Without it the rows are replicated over the TP group,
// so the block takes this TP rank's 1/TP of them into the MoE and
// all-gathers the outputs — a conjugate pair (tokensToEP: split, its
// backward an all-gather; tokensFromEP: all-gather, its backward a split).
// Either way every world rank routes its own slice of the global batch, in
// world rank order, and the MoE layer's token group is the world (its
// auxiliary losses, statistics and capacity are those of the global batch).
// Forward and Backward are collective over the TP group, the EP group and
// the world.
type MoEBlock struct {
	*tp.Block
	MoE *ep.MoE
}

// newMoEBlock registers the block's parameters under layers.NewBlock's
// names (".moe" for the MoE layer): the attention's as this rank's TP
// shards, the router replicated, the experts as this rank's EP shard.
func newMoEBlock(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel, grid *comm.Grid, name string,
	bc layers.BlockConfig, mc layers.MoEConfig, maxTokens int) (*MoEBlock, error) {
	f := &moeFFN{what: "model: moe block " + name, b: b, par: par, split: grid.TP > 1 && !par.SequenceParallel}
	blk, err := tp.NewBlockWith(b, ps, par, name, bc, func() (tp.FeedForward, error) {
		// Gradients are summed over the ranks (not averaged), so the aux
		// term's gradient needs no scale (ep.Parallel.AuxGradScale's default).
		var err error
		f.moe, err = ep.New(b, ps, ep.Parallel{Group: grid.EPGroup, Stream: par.Stream, TokenGroup: grid.World, Overlap: par.Overlap, MaxTokens: maxTokens}, name+".moe", mc)
		return f, err
	})
	if err != nil {
		return nil, err
	}
	return &MoEBlock{Block: blk, MoE: f.moe}, nil
}

// moeFFN is the feed-forward layer of an MoEBlock: the EP layer, behind
// the conjugate pair that hands it this TP rank's slice of replicated rows.
type moeFFN struct {
	what  string
	moe   *ep.MoE
	b     tensor.Backend
	par   tp.Parallel
	split bool           // the rows are replicated over TP > 1: split before the MoE
	ms    *tensor.Tensor // (n/TP, C) this rank's MoE output (split only)
	dhs   *tensor.Tensor // (n/TP, C) backward scratch (split only)
}

func (f *moeFFN) Params() []*layers.Param { return f.moe.Params() }

// Close releases the EP layer's expert path (ep.MoE.Close; tp.Block.Close
// calls it after the attention's sites).
func (f *moeFFN) Close() error { return f.moe.Close() }

// SetAuxWeight is the EP layer's (layers.AuxWeighter).
func (f *moeFFN) SetAuxWeight(w float64) { f.moe.SetAuxWeight(w) }

// AuxLoss is the EP layer's, over the global batch (layers.Block.AuxLoss).
func (f *moeFFN) AuxLoss() float64 { return f.moe.AuxLoss() }

// Stats are the EP layer's, over the global batch (layers.Block.Stats).
func (f *moeFFN) Stats() layers.MoEStats { return f.moe.Stats() }

// StatsAsync is the EP layer's (layers.StatsReader: read one step late).
func (f *moeFFN) StatsAsync() func() (layers.MoEStats, error) { return f.moe.StatsAsync() }

// Shards describes the MoE's parameters: the router replicated with a
// gradient partial per TP rank (each TP rank routes other tokens), and the
// experts as the slice [Lo, Hi) of dimension 0 of the stacked expert
// weights (split over the EP group, not the TP group: see
// Model.ExpertParams).
func (f *moeFFN) Shards() []shard.Shard {
	s := f.moe.Shards()
	for i := range s {
		if s[i].Replicated() {
			s[i].PartialGrad = f.par.Size() > 1
		}
	}
	return s
}

// Forward writes m from h, both (n, C).
func (f *moeFFN) Forward(m, h *tensor.Tensor) error {
	if !f.split {
		return f.moe.Forward(m, h)
	}
	n, C, P := h.Dim(0), h.Dim(1), f.par.Size()
	if n%P != 0 {
		return fmt.Errorf("%s: %d tokens, expected a number divisible by the TP size %d", f.what, n, P)
	}
	f.ms = layerkit.Ensure(f.b, f.ms, h.DType(), n/P, C)
	if err := f.moe.Forward(f.ms, f.tokensToEP(h)); err != nil {
		return err
	}
	return f.tokensFromEP(m, f.ms)
}

// Backward overwrites dh with ∂L/∂h and adds the MoE's gradients, from dm.
func (f *moeFFN) Backward(dh, dm *tensor.Tensor) error {
	if !f.split {
		return f.moe.Backward(dh, dm)
	}
	n, C := dm.Dim(0), dm.Dim(1)
	f.dhs = layerkit.Ensure(f.b, f.dhs, dm.DType(), n/f.par.Size(), C)
	if err := f.moe.Backward(f.dhs, f.tokensFromEPBackward(dm)); err != nil {
		return err
	}
	return f.tokensToEPBackward(dh, f.dhs)
}

// The conjugate pair that hands the TP group's replicated rows to the EP
// layer, one slice per TP rank (rank r takes rows [r·n/P, (r+1)·n/P)).

// tokensToEP — forward: split (a view of this rank's rows of h (n, C)).
func (f *moeFFN) tokensToEP(h *tensor.Tensor) *tensor.Tensor { return f.myRows(h) }

// tokensToEPBackward — backward: all-gather of the slices' gradients dhs
// (n/P, C) into dh (n, C).
func (f *moeFFN) tokensToEPBackward(dh, dhs *tensor.Tensor) error {
	return f.gather("split backward", dh, dhs)
}

// tokensFromEP — forward: all-gather of the slices' outputs ms (n/P, C)
// into m (n, C).
func (f *moeFFN) tokensFromEP(m, ms *tensor.Tensor) error { return f.gather("all-gather", m, ms) }

// tokensFromEPBackward — backward: split (a view of this rank's rows of
// dout (n, C), which is the same on every TP rank).
func (f *moeFFN) tokensFromEPBackward(dout *tensor.Tensor) *tensor.Tensor {
	return f.myRows(dout)
}

// myRows is this TP rank's 1/P of the rows of t (n, C).
func (f *moeFFN) myRows(t *tensor.Tensor) *tensor.Tensor {
	rows := t.Dim(0) / f.par.Size()
	r := f.par.Rank()
	v, err := t.Rows(r*rows, (r+1)*rows)
	if err != nil {
		panic("model: internal error: " + err.Error())
	}
	return v
}

// gather all-gathers src (n/P, C) along the rows into dst (n, C) over the
// TP group and waits for it.
func (f *moeFFN) gather(what string, dst, src *tensor.Tensor) error {
	if err := layerkit.Sticky(f.b, f.what, what); err != nil {
		return err
	}
	s := f.par.Stream
	w, err := overlap.SequenceGatherForward(f.b, f.par.Group, dst, src, s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("%s: %s of the MoE rows over the TP group: %w", f.what, what, err)
	}
	return nil
}
