package model

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/ep"
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
	Shards() []tp.Shard
}

// MoEBlock is layers.Block with an MoE layer: tensor-parallel attention
// and the expert-parallel MoE of parallel/ep,
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
type MoEBlock struct {
	Name  string
	Dim   int
	Norm1 *layers.RMSNorm // replicated
	Attn  *tp.Attention
	Norm2 *layers.RMSNorm // replicated
	MoE   *ep.MoE

	b     tensor.Backend
	par   tp.Parallel
	split bool           // the rows are replicated over TP > 1: split before the MoE
	n     int            // rows of the last Forward (this rank's); 0 before a successful one
	h1    *tensor.Tensor // (n, C) norm1(x)
	a     *tensor.Tensor // (n, C) attn(h1)
	x1    *tensor.Tensor // (n, C) x + a
	h2    *tensor.Tensor // (n, C) norm2(x1)
	m     *tensor.Tensor // (n, C) moe(h2)
	ms    *tensor.Tensor // (n/TP, C) this rank's MoE output (split only)
	dh    *tensor.Tensor // (n, C) backward scratch
	dx1   *tensor.Tensor // (n, C) backward scratch
	dhs   *tensor.Tensor // (n/TP, C) backward scratch (split only)
}

// newMoEBlock registers the block's parameters under layers.NewBlock's
// names (".moe" for the MoE layer): the attention's as this rank's TP
// shards, the router replicated, the experts as this rank's EP shard.
func newMoEBlock(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel, grid *comm.Grid, name string,
	bc layers.BlockConfig, mc layers.MoEConfig) (*MoEBlock, error) {
	blk := &MoEBlock{Name: name, Dim: bc.Dim, b: b, par: par, split: grid.TP > 1 && !par.SequenceParallel}
	var err error
	if blk.Norm1, err = layers.NewRMSNorm(b, ps, name+".attn_norm", bc.Dim, bc.NormEps); err != nil {
		return nil, err
	}
	if blk.Attn, err = tp.NewAttention(b, ps, par, name+".attn", layers.AttentionConfig{
		Dim: bc.Dim, Heads: bc.Heads, RopeTheta: bc.RopeTheta, Std: bc.Std, OutStd: bc.OutStd,
	}); err != nil {
		return nil, err
	}
	if blk.Norm2, err = layers.NewRMSNorm(b, ps, name+".mlp_norm", bc.Dim, bc.NormEps); err != nil {
		return nil, err
	}
	// Gradients are summed over the ranks (not averaged), so the aux
	// term's gradient needs no scale (ep.WithAuxGradScale's default).
	if blk.MoE, err = ep.New(b, grid.EPGroup, ps, name+".moe", mc,
		ep.WithStream(par.Stream), ep.WithTokenGroup(grid.World)); err != nil {
		return nil, err
	}
	return blk, nil
}

// Params returns the block's parameters in the order of the forward.
func (blk *MoEBlock) Params() []*layers.Param {
	ps := []*layers.Param{blk.Norm1.W}
	ps = append(ps, blk.Attn.Params()...)
	ps = append(ps, blk.Norm2.W)
	return append(ps, blk.MoE.Params()...)
}

// Shards describes the block's parameters: the norms replicated (partial
// under sequence parallelism), the attention's TP shards, the router
// replicated with a gradient partial per TP rank (each TP rank routes other
// tokens), and the experts as the slice [Lo, Hi) of dimension 0 of the
// stacked expert weights (split over the EP group, not the TP group: see
// Model.ExpertParams).
func (blk *MoEBlock) Shards() []tp.Shard {
	sp := blk.par.SequenceParallel && blk.par.Size() > 1
	norm := func(p *layers.Param) tp.Shard {
		return tp.Shard{Param: p, Full: p.Shape().Clone(), Dim: -1, Hi: p.Shape()[0], PartialGrad: sp}
	}
	s := []tp.Shard{norm(blk.Norm1.W)}
	s = append(s, blk.Attn.Shards()...)
	s = append(s, norm(blk.Norm2.W))
	for _, in := range blk.MoE.ParamInfos() {
		if in.Kind == ep.Replicated {
			s = append(s, tp.Shard{Param: in.Param, Full: in.Full, Dim: -1, Hi: in.Full[0], PartialGrad: blk.par.Size() > 1})
		} else {
			s = append(s, tp.Shard{Param: in.Param, Full: in.Full, Dim: 0, Lo: in.Lo, Hi: in.Hi})
		}
	}
	return s
}

func (blk *MoEBlock) what() string { return "model: moe block " + blk.Name }

// Forward writes out from x, both (B·T, Dim) — or (B·T/TP, Dim) under
// sequence parallelism; out must not alias x. It is collective over the TP
// group, the EP group and the world.
func (blk *MoEBlock) Forward(out, x *tensor.Tensor, batch, seq int) error {
	blk.n = 0
	P, C := blk.par.Size(), blk.Dim
	n := batch * seq
	if blk.par.SequenceParallel {
		n /= P
	}
	if batch <= 0 || seq <= 0 || (batch*seq)%P != 0 {
		return fmt.Errorf("%s: batch %d × seq %d tokens, expected a positive number divisible by the TP size %d", blk.what(), batch, seq, P)
	}
	dt := blk.Norm1.W.W.DType()
	if err := blk.checkRows("input x", x, dt, n); err != nil {
		return err
	}
	if err := blk.checkRows("output", out, dt, n); err != nil {
		return err
	}
	if overlaps(out, x) {
		return fmt.Errorf("%s: output overlaps input x, expected separate storage", blk.what())
	}
	for _, p := range []**tensor.Tensor{&blk.h1, &blk.a, &blk.x1, &blk.h2, &blk.m} {
		*p = ensure(blk.b, *p, dt, n, C)
	}
	x2, out2 := reshape(x, n, C), reshape(out, n, C)
	if err := blk.Norm1.Forward(blk.h1, x2); err != nil {
		return err
	}
	if err := blk.Attn.Forward(blk.a, blk.h1, batch, seq); err != nil {
		return err
	}
	blk.b.Add(blk.x1, x2, blk.a)
	if err := blk.Norm2.Forward(blk.h2, blk.x1); err != nil {
		return err
	}
	if blk.split {
		blk.ms = ensure(blk.b, blk.ms, dt, n/P, C)
		if err := blk.MoE.Forward(blk.ms, blk.tokensToEP(blk.h2)); err != nil {
			return err
		}
		if err := blk.tokensFromEP(blk.m, blk.ms); err != nil {
			return err
		}
	} else if err := blk.MoE.Forward(blk.m, blk.h2); err != nil {
		return err
	}
	blk.b.Add(out2, blk.x1, blk.m)
	blk.n = n
	return sticky(blk.b, blk.Name+" forward")
}

// Backward overwrites dx (shaped like x) with ∂L/∂x and adds the
// parameters' gradients, from dout (shaped like out); dx must not alias
// dout. Collective, like Forward.
func (blk *MoEBlock) Backward(dx, dout *tensor.Tensor) error {
	if blk.n == 0 {
		return errors.New(blk.what() + ": Backward without a successful Forward")
	}
	dt, n, C, P := blk.Norm1.W.W.DType(), blk.n, blk.Dim, blk.par.Size()
	if err := blk.checkRows("output gradient", dout, dt, n); err != nil {
		return err
	}
	if err := blk.checkRows("input gradient dx", dx, dt, n); err != nil {
		return err
	}
	if overlaps(dx, dout) {
		return fmt.Errorf("%s: input gradient dx overlaps the output gradient, expected separate storage", blk.what())
	}
	blk.dh = ensure(blk.b, blk.dh, dt, n, C)
	blk.dx1 = ensure(blk.b, blk.dx1, dt, n, C)
	dx2, dout2 := reshape(dx, n, C), reshape(dout, n, C)
	// out = x1 + m: ∂L/∂x1 = dout + norm2ᵀ(moeᵀ(dout)).
	if blk.split {
		blk.dhs = ensure(blk.b, blk.dhs, dt, n/P, C)
		if err := blk.MoE.Backward(blk.dhs, blk.tokensFromEPBackward(dout2)); err != nil {
			return err
		}
		if err := blk.tokensToEPBackward(blk.dh, blk.dhs); err != nil {
			return err
		}
	} else if err := blk.MoE.Backward(blk.dh, dout2); err != nil {
		return err
	}
	if err := blk.Norm2.Backward(blk.dx1, blk.dh); err != nil {
		return err
	}
	blk.b.Add(blk.dx1, blk.dx1, dout2)
	// x1 = x + a: ∂L/∂x = dx1 + norm1ᵀ(attnᵀ(dx1)).
	if err := blk.Attn.Backward(blk.dh, blk.dx1); err != nil {
		return err
	}
	if err := blk.Norm1.Backward(dx2, blk.dh); err != nil {
		return err
	}
	blk.b.Add(dx2, dx2, blk.dx1)
	return sticky(blk.b, blk.Name+" backward")
}

// The conjugate pair that hands the TP group's replicated rows to the EP
// layer, one slice per TP rank (rank r takes rows [r·n/P, (r+1)·n/P)).

// tokensToEP — forward: split (a view of this rank's rows of h (n, C)).
func (blk *MoEBlock) tokensToEP(h *tensor.Tensor) *tensor.Tensor { return blk.myRows(h) }

// tokensToEPBackward — backward: all-gather of the slices' gradients dhs
// (n/P, C) into dh (n, C).
func (blk *MoEBlock) tokensToEPBackward(dh, dhs *tensor.Tensor) error {
	return blk.gather("split backward", dh, dhs)
}

// tokensFromEP — forward: all-gather of the slices' outputs ms (n/P, C)
// into m (n, C).
func (blk *MoEBlock) tokensFromEP(m, ms *tensor.Tensor) error { return blk.gather("all-gather", m, ms) }

// tokensFromEPBackward — backward: split (a view of this rank's rows of
// dout (n, C), which is the same on every TP rank).
func (blk *MoEBlock) tokensFromEPBackward(dout *tensor.Tensor) *tensor.Tensor {
	return blk.myRows(dout)
}

// myRows is this TP rank's 1/P of the rows of t (n, C).
func (blk *MoEBlock) myRows(t *tensor.Tensor) *tensor.Tensor {
	rows := t.Dim(0) / blk.par.Size()
	r := blk.par.Rank()
	v, err := t.Rows(r*rows, (r+1)*rows)
	if err != nil {
		panic("model: internal error: " + err.Error())
	}
	return v
}

// gather all-gathers src (n/P, C) along the rows into dst (n, C) over the
// TP group and waits for it.
func (blk *MoEBlock) gather(what string, dst, src *tensor.Tensor) error {
	if err := sticky(blk.b, blk.Name+" "+what); err != nil {
		return err
	}
	s := blk.par.Stream
	w, err := comm.SequenceGatherForward(blk.b, blk.par.Group, dst, src, s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("%s: %s of the MoE rows over the TP group: %w", blk.what(), what, err)
	}
	return nil
}

// checkRows checks that t is a tensor of dtype dt on the backend's device
// holding n rows of the block's width.
func (blk *MoEBlock) checkRows(what string, t *tensor.Tensor, dt tensor.DType, n int) error {
	if t == nil || t.Device() != blk.b.Device() || t.DType() != dt {
		return fmt.Errorf("%s: %s is %v, expected a %v tensor on %v", blk.what(), what, t, dt, blk.b.Device())
	}
	if s := t.Shape(); len(s) < 2 || s[len(s)-1] != blk.Dim || t.Numel() != n*blk.Dim {
		return fmt.Errorf("%s: %s has shape %v, expected %d rows of %d (this rank's tokens)", blk.what(), what, s, n, blk.Dim)
	}
	return nil
}

// overlaps reports whether two tensors share storage.
func overlaps(a, b *tensor.Tensor) bool {
	return a.Buffer() == b.Buffer() && a.Offset() < b.Offset()+b.Numel() && b.Offset() < a.Offset()+a.Numel()
}

// reshape is Tensor.Reshape for shapes already checked.
func reshape(t *tensor.Tensor, shape ...int) *tensor.Tensor {
	r, err := t.Reshape(shape...)
	if err != nil {
		panic("model: internal error: " + err.Error())
	}
	return r
}
