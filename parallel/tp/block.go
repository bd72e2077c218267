package tp

import (
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// FeedForward is the second part of a TP block (layers.FeedForward) with
// its parameters described for the sharded model: the tensor-parallel MLP,
// or another layer (the sharded model's mixture of experts).
type FeedForward interface {
	layers.FeedForward
	// Shards describes the layer's parameters (shard.Shard).
	Shards() []shard.Shard
}

// Block is layers.Block with tensor-parallel parts: the attention and the
// MLP (or NewBlockWith's feed-forward layer),
//
//	x1  = x + attn(norm1(x))
//	out = x1 + mlp(norm2(x1))
//
// It is the shared block itself (the residual adds, the norms and the
// forward and backward are layers.Block's); this type only builds it from
// TP parts and describes its shards. The residual stream and the norms stay
// outside the TP regions: replicated on every TP rank (N, Dim), or, under
// sequence parallelism, split along the tokens (N/P, Dim) — the norms then
// run on this rank's tokens only, and their weights' gradients are partial
// sums over the TP group (Shards marks them PartialGrad).
type Block struct {
	*layers.Block            // the shared block, built from the parts below
	Attn          *Attention // the block's Mixer
	MLP           *MLP       // the block's FFN; nil in a block made by NewBlockWith

	par Parallel
	ffn FeedForward
}

// NewBlock registers name+".attn_norm", ".attn", ".mlp_norm" and ".mlp"
// like layers.NewBlock, the attention and MLP weights as this rank's
// shards. P must divide Heads, KVHeads and FFN.
func NewBlock(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg layers.BlockConfig) (*Block, error) {
	blk, err := NewBlockWith(b, ps, par, name, cfg, func() (FeedForward, error) {
		return NewMLP(b, ps, par, name+".mlp", layers.MLPConfig{
			Dim: cfg.Dim, Hidden: cfg.FFN, Std: cfg.Std, OutStd: cfg.OutStd,
		})
	})
	if err != nil {
		return nil, err
	}
	blk.MLP = blk.ffn.(*MLP)
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
	blk := &Block{par: par}
	var err error
	blk.Block, err = layers.NewBlockFrom(b, ps, name, cfg.Dim, cfg.NormEps, layers.BlockParts{
		Mixer: func() (layers.Mixer, error) {
			var err error
			blk.Attn, err = NewAttention(b, ps, par, name+".attn", layers.AttentionConfig{
				Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: cfg.KVHeads, RopeTheta: cfg.RopeTheta, Std: cfg.Std, OutStd: cfg.OutStd,
			})
			return blk.Attn, err
		},
		FFN: func() (layers.FeedForward, error) {
			var err error
			blk.ffn, err = newFFN()
			return blk.ffn, err
		},
		Rows: func(tokens int) (int, error) { return par.seqRows("tp: block "+name, tokens) },
	})
	if err != nil {
		return nil, err
	}
	return blk, nil
}

// Shards describes the block's parameters.
func (blk *Block) Shards() []shard.Shard {
	sp := blk.par.SequenceParallel && blk.par.Size() > 1
	s := []shard.Shard{shard.Replicated(blk.Norm1.W, sp)}
	s = append(s, blk.Attn.Shards()...)
	s = append(s, shard.Replicated(blk.Norm2.W, sp))
	return append(s, blk.ffn.Shards()...)
}

// Forward writes out from x, both (B·T, Dim) — or (B·T/P, Dim) under
// sequence parallelism; out must not alias x. It is layers.Block's
// ForwardSeq.
func (blk *Block) Forward(out, x *tensor.Tensor, batch, seq int) error {
	return blk.ForwardSeq(out, x, batch, seq)
}
