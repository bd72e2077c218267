package layers

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// BlockConfig describes a transformer block.
type BlockConfig struct {
	Dim, Heads, FFN int
	RopeTheta       float64
	NormEps         float32
	Std             float64 // init std of the input projections
	OutStd          float64 // init std of wo and w_down
	// MoE, when not nil, replaces the MLP by a mixture-of-experts layer
	// (its Dim is the block's; Hidden 0 means FFN; Std and OutStd 0 mean
	// the block's).
	MoE *MoEConfig
}

// Block is a pre-norm transformer block:
//
//	x1  = x + attn(norm1(x))
//	out = x1 + mlp(norm2(x1))
//
// where mlp is the dense MLP or, in an MoE block, the mixture of experts
// (then MLP is nil, and the block's objective includes MoE.AuxLoss).
type Block struct {
	Name  string
	Dim   int
	Norm1 *RMSNorm
	Attn  *Attention
	Norm2 *RMSNorm
	MLP   *MLP
	MoE   *MoE // nil in a dense block

	b   tensor.Backend
	bt  [2]int         // B, T of the last Forward; zeros before a successful one
	h1  *tensor.Tensor // (B, T, C) norm1(x)
	a   *tensor.Tensor // (B, T, C) attn(h1)
	x1  *tensor.Tensor // (B, T, C) x + a
	h2  *tensor.Tensor // (B, T, C) norm2(x1)
	m   *tensor.Tensor // (B, T, C) mlp(h2)
	dh  *tensor.Tensor // (B, T, C) backward scratch: ∂L/∂h2, then ∂L/∂h1
	dx1 *tensor.Tensor // (B, T, C) backward scratch: ∂L/∂x1
}

// NewBlock registers name+".attn_norm", ".attn", ".mlp_norm" and ".mlp"
// (".moe" in an MoE block).
func NewBlock(b tensor.Backend, ps *ParamSet, name string, cfg BlockConfig) (*Block, error) {
	blk := &Block{Name: name, Dim: cfg.Dim, b: b}
	var err error
	if blk.Norm1, err = NewRMSNorm(b, ps, name+".attn_norm", cfg.Dim, cfg.NormEps); err != nil {
		return nil, err
	}
	if blk.Attn, err = NewAttention(b, ps, name+".attn", AttentionConfig{
		Dim: cfg.Dim, Heads: cfg.Heads, RopeTheta: cfg.RopeTheta, Std: cfg.Std, OutStd: cfg.OutStd,
	}); err != nil {
		return nil, err
	}
	if blk.Norm2, err = NewRMSNorm(b, ps, name+".mlp_norm", cfg.Dim, cfg.NormEps); err != nil {
		return nil, err
	}
	if cfg.MoE != nil {
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
		if blk.MoE, err = NewMoE(b, ps, name+".moe", mc); err != nil {
			return nil, err
		}
		return blk, nil
	}
	if blk.MLP, err = NewMLP(b, ps, name+".mlp", MLPConfig{
		Dim: cfg.Dim, Hidden: cfg.FFN, Std: cfg.Std, OutStd: cfg.OutStd,
	}); err != nil {
		return nil, err
	}
	return blk, nil
}

// Params returns the block's parameters in the order of the forward.
func (blk *Block) Params() []*Param {
	ps := []*Param{blk.Norm1.W}
	ps = append(ps, blk.Attn.Params()...)
	ps = append(ps, blk.Norm2.W)
	if blk.MoE != nil {
		return append(ps, blk.MoE.Params()...)
	}
	return append(ps, blk.MLP.Params()...)
}

// ffn is the block's feed-forward layer: the MLP or the MoE.
func (blk *Block) ffn() interface {
	Forward(out, x *tensor.Tensor) error
	Backward(dx, dout *tensor.Tensor) error
} {
	if blk.MoE != nil {
		return blk.MoE
	}
	return blk.MLP
}

// AuxLoss is the auxiliary loss of the block's last Forward: the MoE's
// (AuxLoss of MoE), 0 in a dense block.
func (blk *Block) AuxLoss() float64 {
	if blk.MoE != nil {
		return blk.MoE.AuxLoss()
	}
	return 0
}

func (blk *Block) what() string { return "layers: block " + blk.Name }

// Forward writes out (B, T, Dim) from x (B, T, Dim); out must not alias x.
func (blk *Block) Forward(out, x *tensor.Tensor) error {
	blk.bt = [2]int{}
	if err := CheckParams(blk.what(), blk.Params()...); err != nil {
		return err
	}
	dt := blk.Norm1.W.W.DType()
	if err := CheckOn(blk.b, blk.what(), "input x", x, dt); err != nil {
		return err
	}
	if s := x.Shape(); len(s) != 3 || s[2] != blk.Dim || s[0] <= 0 || s[1] <= 0 {
		return fmt.Errorf("%s: input x has shape %v, expected (B, T, %d)", blk.what(), s, blk.Dim)
	}
	B, T, C := x.Dim(0), x.Dim(1), blk.Dim
	if err := CheckShape(blk.b, blk.what(), "output", out, dt, B, T, C); err != nil {
		return err
	}
	if err := CheckApart(blk.what(), "output", out, "input x", x); err != nil {
		return err
	}
	for _, p := range []**tensor.Tensor{&blk.h1, &blk.a, &blk.x1, &blk.h2, &blk.m} {
		*p = Ensure(blk.b, *p, dt, B, T, C)
	}
	if err := blk.Norm1.Forward(blk.h1, x); err != nil {
		return err
	}
	if err := blk.Attn.Forward(blk.a, blk.h1); err != nil {
		return err
	}
	blk.b.Add(blk.x1, x, blk.a)
	if err := blk.Norm2.Forward(blk.h2, blk.x1); err != nil {
		return err
	}
	if err := blk.ffn().Forward(blk.m, blk.h2); err != nil {
		return err
	}
	blk.b.Add(out, blk.x1, blk.m)
	blk.bt = [2]int{B, T}
	return Sticky(blk.b, blk.what(), "forward")
}

// Backward overwrites dx (B, T, Dim) with ∂L/∂x and adds the parameters'
// gradients, from dout (B, T, Dim); dx must not alias dout.
func (blk *Block) Backward(dx, dout *tensor.Tensor) error {
	if blk.bt[0] == 0 {
		return errors.New(blk.what() + ": Backward without a successful Forward")
	}
	dt := blk.Norm1.W.W.DType()
	B, T, C := blk.bt[0], blk.bt[1], blk.Dim
	if err := CheckShape(blk.b, blk.what(), "output gradient", dout, dt, B, T, C); err != nil {
		return err
	}
	if err := CheckShape(blk.b, blk.what(), "input gradient dx", dx, dt, B, T, C); err != nil {
		return err
	}
	if err := CheckApart(blk.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	blk.dh = Ensure(blk.b, blk.dh, dt, B, T, C)
	blk.dx1 = Ensure(blk.b, blk.dx1, dt, B, T, C)
	// out = x1 + m: ∂L/∂x1 = dout + norm2ᵀ(mlpᵀ(dout)).
	if err := blk.ffn().Backward(blk.dh, dout); err != nil {
		return err
	}
	if err := blk.Norm2.Backward(blk.dx1, blk.dh); err != nil {
		return err
	}
	blk.b.Add(blk.dx1, blk.dx1, dout)
	// x1 = x + a: ∂L/∂x = dx1 + norm1ᵀ(attnᵀ(dx1)).
	if err := blk.Attn.Backward(blk.dh, blk.dx1); err != nil {
		return err
	}
	if err := blk.Norm1.Backward(dx, blk.dh); err != nil {
		return err
	}
	blk.b.Add(dx, dx, blk.dx1)
	return Sticky(blk.b, blk.what(), "backward")
}
