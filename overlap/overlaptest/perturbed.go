package overlaptest

import (
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// Perturbed is a deliberately wrong strategy, for testing what must catch
// one (this suite, shadow mode): the sites of Strategy, under its name,
// whose forward output has one chunk scaled by Scale — the rows of the
// first exchange step's shard (the rows of rank r+1 of all-gather∘matmul's
// gathered input; the first of this rank's rows of matmul∘reduce-scatter's
// output; the first row of matmul∘all-reduce's). The backward is
// Strategy's. Scale 1 perturbs nothing.
type Perturbed struct {
	overlap.Strategy
	Scale float32
}

// NewAllGatherMatmul builds Strategy's site, perturbed.
func (p Perturbed) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	s, err := p.Strategy.NewAllGatherMatmul(sp)
	if err != nil {
		return nil, err
	}
	return perturbedAGMM{s, p, sp}, nil
}

// NewMatmulReduceScatter builds Strategy's site, perturbed.
func (p Perturbed) NewMatmulReduceScatter(sp overlap.Spec) (overlap.MatmulReduceScatter, error) {
	s, err := p.Strategy.NewMatmulReduceScatter(sp)
	if err != nil {
		return nil, err
	}
	return perturbedMMRS{s, p, sp}, nil
}

// NewMatmulAllReduce builds Strategy's site, perturbed.
func (p Perturbed) NewMatmulAllReduce(sp overlap.Spec) (overlap.MatmulAllReduce, error) {
	s, err := p.Strategy.NewMatmulAllReduce(sp)
	if err != nil {
		return nil, err
	}
	return perturbedMMAR{s, p, sp}, nil
}

// scaleRows scales rows [lo, hi) of t by s.
func scaleRows(b tensor.Backend, t *tensor.Tensor, lo, hi int, s float32) {
	if hi > t.Dim(0) || lo >= hi {
		return
	}
	v, err := t.Rows(lo, hi)
	if err != nil {
		return
	}
	b.Scale(v, v, s)
}

type perturbedAGMM struct {
	overlap.AllGatherMatmul
	p  Perturbed
	sp overlap.Spec
}

func (s perturbedAGMM) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	if err := s.AllGatherMatmul.Forward(outs, xFull, x, ws); err != nil {
		return err
	}
	P, r, n := s.sp.Group.Size(), s.sp.Group.Rank(), x.Dim(0)
	q := (r + 1) % P
	for _, o := range outs {
		scaleRows(s.sp.Backend, o, q*n, (q+1)*n, s.p.Scale)
	}
	return nil
}

type perturbedMMRS struct {
	overlap.MatmulReduceScatter
	p  Perturbed
	sp overlap.Spec
}

func (s perturbedMMRS) Forward(out, x, w *tensor.Tensor) error {
	if err := s.MatmulReduceScatter.Forward(out, x, w); err != nil {
		return err
	}
	scaleRows(s.sp.Backend, out, 0, 1, s.p.Scale)
	return nil
}

type perturbedMMAR struct {
	overlap.MatmulAllReduce
	p  Perturbed
	sp overlap.Spec
}

func (s perturbedMMAR) Run(out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) (comm.Work, error) {
	w, err := s.MatmulAllReduce.Run(out, as, ws, transW)
	if err != nil {
		return nil, err
	}
	if err := w.Wait(s.sp.Stream); err != nil {
		return nil, err
	}
	scaleRows(s.sp.Backend, out, 0, 1, s.p.Scale)
	return comm.Done, nil
}
