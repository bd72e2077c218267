package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// BlockConfig describes a transformer block.
type BlockConfig struct {
	Dim, Heads, FFN int     // width, query heads, the MLP's hidden width
	KVHeads         int     // key/value heads of the attention (0: Heads)
	RopeTheta       float64 // base of the rotary embedding
	NormEps         float32 // the norms' epsilon
	Std             float64 // init std of the input projections
	OutStd          float64 // init std of wo and w_down
	// MoE, when not nil, replaces the MLP by a mixture-of-experts layer
	// (its Dim is the block's; Hidden 0 means FFN; Std and OutStd 0 mean
	// the block's).
	MoE *MoEConfig
}

// Mixer is the first part of a block, the token mixer: causal
// self-attention over the rows of a batch of sequences. Attention is one
// (its ForwardSeq form); tp.Attention, with its heads split over a TP
// group, is another.
type Mixer interface {
	// ForwardSeq writes out from x, both (n, Dim): the rows this rank
	// holds of batch sequences of seq tokens (n = batch·seq, or this
	// rank's tokens of them under sequence parallelism).
	ForwardSeq(out, x *tensor.Tensor, batch, seq int) error
	// Backward overwrites dx with ∂L/∂x and adds the parameters'
	// gradients, from dout, both shaped like the forward's x.
	Backward(dx, dout *tensor.Tensor) error
	// Params returns the layer's parameters.
	Params() []*Param
}

// FeedForward is the second part of a block, on the rows of the residual
// stream: MLP and MoE here; tp.MLP and the sharded model's
// expert-parallel MoE elsewhere. A feed-forward layer with an auxiliary
// loss (AuxLoss() float64) or routing statistics (Stats() MoEStats) has
// them reported by the block and the Decoder. It is a Layer on (n, Dim)
// rows.
type FeedForward interface {
	Layer
}

// BlockParts are the parts NewBlockFrom builds a block from. Mixer and FFN
// register their parameters and return the layer; they are called in that
// order, after the block's attention norm and before and after its MLP
// norm respectively, so that the parameters come in the forward's order.
type BlockParts struct {
	Mixer func() (Mixer, error)       // builds the first part (attention)
	FFN   func() (FeedForward, error) // builds the second part (MLP, MoE)
	// Rows returns the rows of the residual stream this rank holds of a
	// batch of tokens (nil: all of them); under sequence parallelism the
	// stream, the norms and the parts' inputs and outputs are this rank's
	// token shard. Its errors are returned as they are (they name the
	// layer).
	Rows func(tokens int) (int, error)
}

// Block is a pre-norm transformer block:
//
//	x1  = x + attn(norm1(x))
//	out = x1 + ffn(norm2(x1))
//
// on the rows of the residual stream, where attn is its Mixer and ffn its
// FeedForward: the dense MLP or, in an MoE block, the mixture of experts
// (then the block's objective includes the MoE's AuxLoss). It is the one
// block of the single-rank GPT and of the sharded model (parallel/tp's
// Block is this block with tensor-parallel parts): the residual adds and
// the norms are here, and the parts own whatever communication they need.
type Block struct {
	Name  string      // the block's name, its parameters' prefix
	Dim   int         // the residual stream's width
	Norm1 *RMSNorm    // before the mixer
	Mixer Mixer       // Attn, or another mixer (tp.Attention)
	Norm2 *RMSNorm    // before the feed-forward layer
	FFN   FeedForward // MLP or MoE, or another feed-forward layer

	// The parts when they are this package's layers (nil otherwise).
	Attn *Attention // the Mixer
	MLP  *MLP       // the FFN of a dense block
	MoE  *MoE       // the FFN of an MoE block (nil in a dense block)

	b    tensor.Backend
	rows func(tokens int) (int, error)
	bt   [2]int         // B, T of the last Forward; zeros before a successful one
	n    int            // rows of the last Forward
	in3D bool           // the last Forward was the (B, T, Dim) form
	h1   *tensor.Tensor // (n, C) norm1(x)
	a    *tensor.Tensor // (n, C) attn(h1), dead after the forward's add
	x1   *tensor.Tensor // (n, C) x + a
	h2   *tensor.Tensor // (n, C) norm2(x1)
	m    *tensor.Tensor // (n, C) ffn(h2), dead after the forward's add (a's buffer with a workspace)
	dh   *tensor.Tensor // (n, C) backward scratch: ∂L/∂h2, then ∂L/∂h1
	dx1  *tensor.Tensor // (n, C) backward scratch: ∂L/∂x1
	ws   *workspace     // shared buffers (NewBlock); nil: the block's own
	kept *workspace     // where h1, x1, h2 go under RecomputeBlock (the set's workspace)
}

// NewBlock registers name+".attn_norm", ".attn", ".mlp_norm" and ".mlp"
// (".moe" in an MoE block).
func NewBlock(b tensor.Backend, ps *ParamSet, name string, cfg BlockConfig) (*Block, error) {
	var attn *Attention
	var mlp *MLP
	var moe *MoE
	blk, err := NewBlockFrom(b, ps, name, cfg.Dim, cfg.NormEps, BlockParts{
		Mixer: func() (Mixer, error) {
			var err error
			attn, err = NewAttention(b, ps, name+".attn", AttentionConfig{
				Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: cfg.KVHeads, RopeTheta: cfg.RopeTheta, Std: cfg.Std, OutStd: cfg.OutStd,
			})
			return attn, err
		},
		FFN: func() (FeedForward, error) {
			var err error
			if cfg.MoE == nil {
				mlp, err = NewMLP(b, ps, name+".mlp", MLPConfig{
					Dim: cfg.Dim, Hidden: cfg.FFN, Std: cfg.Std, OutStd: cfg.OutStd,
				})
				return mlp, err
			}
			mc := *cfg.MoE
			mc.Dim = cfg.Dim
			if mc.Hidden == 0 {
				mc.Hidden = cfg.FFN
			}
			if mc.Std == 0 {
				mc.Std = cfg.Std
			}
			if mc.OutStd == 0 {
				mc.OutStd = cfg.OutStd
			}
			moe, err = NewMoE(b, ps, name+".moe", mc)
			return moe, err
		},
	})
	if err != nil {
		return nil, err
	}
	blk.Attn, blk.MLP, blk.MoE = attn, mlp, moe
	blk.ws = ps.workspace(b)
	return blk, nil
}

// NewBlockFrom registers name+".attn_norm", then the mixer parts.Mixer
// makes, name+".mlp_norm", then the feed-forward layer parts.FFN makes,
// and returns the block of them (of width dim, norms with eps).
func NewBlockFrom(b tensor.Backend, ps *ParamSet, name string, dim int, eps float32, parts BlockParts) (*Block, error) {
	if parts.Mixer == nil || parts.FFN == nil {
		return nil, fmt.Errorf("layers: block %q: BlockParts without a Mixer or an FFN constructor, expected both", name)
	}
	blk := &Block{Name: name, Dim: dim, b: b, rows: parts.Rows, kept: ps.workspace(b)}
	var err error
	if blk.Norm1, err = NewRMSNorm(b, ps, name+".attn_norm", dim, eps); err != nil {
		return nil, err
	}
	if blk.Mixer, err = parts.Mixer(); err != nil {
		return nil, err
	}
	if blk.Norm2, err = NewRMSNorm(b, ps, name+".mlp_norm", dim, eps); err != nil {
		return nil, err
	}
	if blk.FFN, err = parts.FFN(); err != nil {
		return nil, err
	}
	if blk.Mixer == nil || blk.FFN == nil {
		return nil, fmt.Errorf("layers: block %q: a part constructor returned a nil layer and no error", name)
	}
	return blk, nil
}

// Params returns the block's parameters in the order of the forward.
func (blk *Block) Params() []*Param {
	ps := []*Param{blk.Norm1.W}
	ps = append(ps, blk.Mixer.Params()...)
	ps = append(ps, blk.Norm2.W)
	return append(ps, blk.FFN.Params()...)
}

// AuxLoss is the auxiliary loss of the block's last Forward: its
// feed-forward layer's (an MoE's AuxLoss), 0 in a dense block.
func (blk *Block) AuxLoss() float64 {
	if a, ok := blk.FFN.(interface{ AuxLoss() float64 }); ok {
		return a.AuxLoss()
	}
	return 0
}

// Stats returns the routing statistics of the block's last Forward and
// true in an MoE block (a feed-forward layer with Stats), false otherwise.
func (blk *Block) Stats() (MoEStats, bool) {
	if s, ok := blk.FFN.(interface{ Stats() MoEStats }); ok {
		return s.Stats(), true
	}
	return MoEStats{}, false
}

func (blk *Block) what() string { return "layers: block " + blk.Name }

// Forward writes out (B, T, Dim) from x (B, T, Dim); out must not alias x.
func (blk *Block) Forward(out, x *tensor.Tensor) error {
	blk.bt = [2]int{}
	if err := checkParams(blk.what(), blk.Params()...); err != nil {
		return err
	}
	dt := blk.Norm1.W.W.DType()
	if err := layerkit.CheckOn(blk.b, blk.what(), "input x", x, dt); err != nil {
		return err
	}
	if s := x.Shape(); len(s) != 3 || s[2] != blk.Dim || s[0] <= 0 || s[1] <= 0 {
		return fmt.Errorf("%s: input x has shape %v, expected (B, T, %d)", blk.what(), s, blk.Dim)
	}
	B, T, C := x.Dim(0), x.Dim(1), blk.Dim
	if err := layerkit.CheckShape(blk.b, blk.what(), "output", out, dt, B, T, C); err != nil {
		return err
	}
	if err := layerkit.CheckApart(blk.what(), "output", out, "input x", x); err != nil {
		return err
	}
	if err := blk.forward(layerkit.Reshape(out, B*T, C), layerkit.Reshape(x, B*T, C), B, T); err != nil {
		return err
	}
	blk.in3D = true
	return nil
}

// ForwardSeq is Forward on rows: out and x are (n, Dim), the rows this
// rank holds of batch sequences of seq tokens (all batch·seq of them, or
// BlockParts.Rows of them); out must not alias x. A Backward after it takes
// its gradients shaped the same way.
func (blk *Block) ForwardSeq(out, x *tensor.Tensor, batch, seq int) error {
	blk.bt = [2]int{}
	if err := checkParams(blk.what(), blk.Params()...); err != nil {
		return err
	}
	if batch <= 0 || seq <= 0 {
		return fmt.Errorf("%s: batch %d, seq %d, expected positive sizes", blk.what(), batch, seq)
	}
	dt, C := blk.Norm1.W.W.DType(), blk.Dim
	n := batch * seq
	if blk.rows != nil {
		var err error
		if n, err = blk.rows(n); err != nil {
			return err
		}
	}
	if err := layerkit.CheckRowsN(blk.b, blk.what(), "input x", x, dt, C, n, fmt.Sprintf("this rank's tokens of batch %d × seq %d", batch, seq)); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(blk.b, blk.what(), "output", out, dt, C, n, "like the input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(blk.what(), "output", out, "input x", x); err != nil {
		return err
	}
	return blk.forward(layerkit.Reshape(out, n, C), layerkit.Reshape(x, n, C), batch, seq)
}

// forward runs the block on validated rows x, out (n, Dim).
func (blk *Block) forward(out, x *tensor.Tensor, batch, seq int) error {
	dt, n, C := x.DType(), x.Dim(0), blk.Dim
	for _, p := range []struct {
		t    **tensor.Tensor
		slot int
	}{{&blk.h1, wsKeepH1}, {&blk.x1, wsKeepX1}, {&blk.h2, wsKeepH2}} {
		*p.t = blk.kept.keep(p.slot, RecomputeBlock, blk.b, *p.t, dt, n, C)
	}
	// a and m are dead once added into the stream (a before m is written):
	// one buffer for both, shared by the blocks.
	blk.a = blk.ws.ensure(wsBlockOut, blk.b, blk.a, dt, n, C)
	if blk.ws != nil {
		blk.m = blk.a
	} else {
		blk.m = layerkit.Ensure(blk.b, blk.m, dt, n, C)
	}
	if err := blk.Norm1.Forward(blk.h1, x); err != nil {
		return err
	}
	if err := blk.Mixer.ForwardSeq(blk.a, blk.h1, batch, seq); err != nil {
		return err
	}
	// x1 = x + a and h2 = norm2(x1) in one op.
	if err := blk.Norm2.ForwardAdd(blk.x1, blk.h2, x, blk.a); err != nil {
		return err
	}
	if err := blk.FFN.Forward(blk.m, blk.h2); err != nil {
		return err
	}
	blk.b.Add(out, blk.x1, blk.m)
	if err := layerkit.Sticky(blk.b, blk.what(), "forward"); err != nil {
		return err
	}
	blk.bt, blk.n, blk.in3D = [2]int{batch, seq}, n, false
	return nil
}

// Backward overwrites dx with ∂L/∂x and adds the parameters' gradients,
// from dout, both shaped like the forward's x: (B, T, Dim) after Forward,
// (n, Dim) rows after ForwardSeq; dx must not alias dout.
func (blk *Block) Backward(dx, dout *tensor.Tensor) error {
	if blk.bt[0] == 0 {
		return errors.New(blk.what() + ": Backward without a successful Forward")
	}
	dt, n, C := blk.Norm1.W.W.DType(), blk.n, blk.Dim
	for _, g := range []struct {
		what, why string
		t         *tensor.Tensor
	}{{"output gradient", "like the forward's output", dout}, {"input gradient dx", "like the forward's input", dx}} {
		var err error
		if blk.in3D {
			err = layerkit.CheckShape(blk.b, blk.what(), g.what, g.t, dt, blk.bt[0], blk.bt[1], C)
		} else {
			err = layerkit.CheckRowsN(blk.b, blk.what(), g.what, g.t, dt, C, n, g.why)
		}
		if err != nil {
			return err
		}
	}
	if err := layerkit.CheckApart(blk.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	blk.dh = blk.ws.ensure(wsBlockDH, blk.b, blk.dh, dt, n, C)
	blk.dx1 = blk.ws.ensure(wsBlockDX1, blk.b, blk.dx1, dt, n, C)
	dx2, dout2 := layerkit.Reshape(dx, n, C), layerkit.Reshape(dout, n, C)
	// out = x1 + m: ∂L/∂x1 = dout + norm2ᵀ(ffnᵀ(dout)).
	if err := blk.FFN.Backward(blk.dh, dout2); err != nil {
		return err
	}
	if err := blk.Norm2.BackwardAdd(blk.dx1, blk.dh, dout2); err != nil { // + dout, in the same op
		return err
	}
	// x1 = x + a: ∂L/∂x = dx1 + norm1ᵀ(attnᵀ(dx1)).
	if err := blk.Mixer.Backward(blk.dh, blk.dx1); err != nil {
		return err
	}
	if err := blk.Norm1.BackwardAdd(dx2, blk.dh, blk.dx1); err != nil { // + dx1, in the same op
		return err
	}
	return layerkit.Sticky(blk.b, blk.what(), "backward")
}
