package tp

import (
	"fmt"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// FeedForward is the second half of a block, on the rows of the residual
// stream: the tensor-parallel MLP, or another layer (the sharded model's
// mixture of experts).
type FeedForward interface {
	// Forward writes out from x, both (n, Dim).
	Forward(out, x *tensor.Tensor) error
	// Backward overwrites dx with ∂L/∂x and adds the parameters'
	// gradients, from dout.
	Backward(dx, dout *tensor.Tensor) error
	Params() []*layers.Param
	Shards() []Shard
}

// Block is layers.Block with tensor-parallel attention and MLP:
//
//	x1  = x + attn(norm1(x))
//	out = x1 + mlp(norm2(x1))
//
// The residual stream and the norms stay outside the TP regions: replicated
// on every TP rank (N, Dim), or, under sequence parallelism, split along the
// tokens (N/P, Dim) — the norms then run on this rank's tokens only, and
// their weights' gradients are partial sums over the TP group (Shards marks
// them PartialGrad). A block made by NewBlockWith runs another feed-forward
// layer in place of the MLP.
type Block struct {
	Name  string
	Dim   int
	Norm1 *layers.RMSNorm // replicated
	Attn  *Attention
	Norm2 *layers.RMSNorm // replicated
	MLP   *MLP            // nil in a block made by NewBlockWith
	FFN   FeedForward     // the MLP, or NewBlockWith's feed-forward layer

	b   tensor.Backend
	par Parallel
	n   int            // rows of the last Forward (this rank's tokens); 0 before a successful one
	h1  *tensor.Tensor // (n, C) norm1(x)
	a   *tensor.Tensor // (n, C) attn(h1)
	x1  *tensor.Tensor // (n, C) x + a
	h2  *tensor.Tensor // (n, C) norm2(x1)
	m   *tensor.Tensor // (n, C) ffn(h2)
	dh  *tensor.Tensor // (n, C) backward scratch
	dx1 *tensor.Tensor // (n, C) backward scratch
}

// NewBlock registers name+".attn_norm", ".attn", ".mlp_norm" and ".mlp"
// like layers.NewBlock, the attention and MLP weights as this rank's
// shards. P must divide Heads and FFN.
func NewBlock(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg layers.BlockConfig) (*Block, error) {
	blk, err := NewBlockWith(b, ps, par, name, cfg, func() (FeedForward, error) {
		return NewMLP(b, ps, par, name+".mlp", layers.MLPConfig{
			Dim: cfg.Dim, Hidden: cfg.FFN, Std: cfg.Std, OutStd: cfg.OutStd,
		})
	})
	if err != nil {
		return nil, err
	}
	blk.MLP = blk.FFN.(*MLP)
	return blk, nil
}

// NewBlockWith is NewBlock with the feed-forward layer that newFFN makes,
// after the block has registered its norms and attention (newFFN registers
// the layer's parameters, so that they come in layers.NewBlock's order).
func NewBlockWith(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg layers.BlockConfig,
	newFFN func() (FeedForward, error)) (*Block, error) {
	if err := par.check("tp: block " + name); err != nil {
		return nil, err
	}
	blk := &Block{Name: name, Dim: cfg.Dim, b: b, par: par}
	var err error
	if blk.Norm1, err = layers.NewRMSNorm(b, ps, name+".attn_norm", cfg.Dim, cfg.NormEps); err != nil {
		return nil, err
	}
	if blk.Attn, err = NewAttention(b, ps, par, name+".attn", layers.AttentionConfig{
		Dim: cfg.Dim, Heads: cfg.Heads, RopeTheta: cfg.RopeTheta, Std: cfg.Std, OutStd: cfg.OutStd,
	}); err != nil {
		return nil, err
	}
	if blk.Norm2, err = layers.NewRMSNorm(b, ps, name+".mlp_norm", cfg.Dim, cfg.NormEps); err != nil {
		return nil, err
	}
	if blk.FFN, err = newFFN(); err != nil {
		return nil, err
	}
	return blk, nil
}

// Params returns the block's parameters in the order of the forward.
func (blk *Block) Params() []*layers.Param {
	ps := []*layers.Param{blk.Norm1.W}
	ps = append(ps, blk.Attn.Params()...)
	ps = append(ps, blk.Norm2.W)
	return append(ps, blk.FFN.Params()...)
}

// Shards describes the block's parameters.
func (blk *Block) Shards() []Shard {
	sp := blk.par.SequenceParallel && blk.par.Size() > 1
	s := []Shard{replicated(blk.Norm1.W, sp)}
	s = append(s, blk.Attn.Shards()...)
	s = append(s, replicated(blk.Norm2.W, sp))
	return append(s, blk.FFN.Shards()...)
}

func (blk *Block) what() string { return "tp: block " + blk.Name }

// Forward writes out from x, both (B·T, Dim) — or (B·T/P, Dim) under
// sequence parallelism; out must not alias x.
func (blk *Block) Forward(out, x *tensor.Tensor, batch, seq int) error {
	blk.n = 0
	if batch <= 0 || seq <= 0 {
		return fmt.Errorf("%s: batch %d, seq %d, expected positive sizes", blk.what(), batch, seq)
	}
	dt := blk.Norm1.W.W.DType()
	C := blk.Dim
	n, err := blk.par.seqRows(blk.what(), batch*seq)
	if err != nil {
		return err
	}
	if err := layers.CheckRowsN(blk.b, blk.what(), "input x", x, dt, C, n, fmt.Sprintf("this rank's tokens of batch %d × seq %d", batch, seq)); err != nil {
		return err
	}
	if err := layers.CheckRowsN(blk.b, blk.what(), "output", out, dt, C, n, "like the input"); err != nil {
		return err
	}
	if err := layers.CheckApart(blk.what(), "output", out, "input x", x); err != nil {
		return err
	}
	for _, p := range []**tensor.Tensor{&blk.h1, &blk.a, &blk.x1, &blk.h2, &blk.m} {
		*p = layers.Ensure(blk.b, *p, dt, n, C)
	}
	x2, out2 := layers.Reshape(x, n, C), layers.Reshape(out, n, C)
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
	if err := blk.FFN.Forward(blk.m, blk.h2); err != nil {
		return err
	}
	blk.b.Add(out2, blk.x1, blk.m)
	blk.n = n
	return layers.Sticky(blk.b, blk.what(), "forward")
}

// Backward overwrites dx (shaped like x) with ∂L/∂x and adds the
// parameters' gradients, from dout (shaped like out); dx must not alias
// dout.
func (blk *Block) Backward(dx, dout *tensor.Tensor) error {
	if blk.n == 0 {
		return fmt.Errorf("%s: %w", blk.what(), errNoForward)
	}
	dt, n, C := blk.Norm1.W.W.DType(), blk.n, blk.Dim
	if err := layers.CheckRowsN(blk.b, blk.what(), "output gradient", dout, dt, C, n, "like the forward's output"); err != nil {
		return err
	}
	if err := layers.CheckRowsN(blk.b, blk.what(), "input gradient dx", dx, dt, C, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layers.CheckApart(blk.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	blk.dh = layers.Ensure(blk.b, blk.dh, dt, n, C)
	blk.dx1 = layers.Ensure(blk.b, blk.dx1, dt, n, C)
	dx2, dout2 := layers.Reshape(dx, n, C), layers.Reshape(dout, n, C)
	// out = x1 + m: ∂L/∂x1 = dout + norm2ᵀ(ffnᵀ(dout)).
	if err := blk.FFN.Backward(blk.dh, dout2); err != nil {
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
	return layers.Sticky(blk.b, blk.what(), "backward")
}
