package overlap

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Collective is the strategy "collective", the reference: the whole
// collective, then the matmul (or the matmul, then the collective), on the
// backend's stream. Every transport can run it.
//
//	site kind                forward / backward                              transfer                         requirements
//	all-gather∘matmul        all-gather x, then out_i = xFull·W_iᵀ;          the group's all-gather and       any group, any backend
//	                         backward: dW_i += dout_iᵀ·xFull, then           reduce-scatter
//	                         dx = reduce-scatter(Σ_i dout_i·W_i)
//	matmul∘reduce-scatter    x·Wᵀ, then reduce-scatter; backward:            the group's reduce-scatter and   any group, any backend
//	                         all-gather dout, dx = doutFull·W,               all-gather
//	                         dW += doutFullᵀ·x
//	matmul∘all-reduce        Σ_i a_i·op(W_i), then all-reduce                the group's all-reduce           any group, any backend
//	expert (MoE)             parallel/ep's dispatcher: counts exchanged,     the group's all-to-all-v         any group, any backend
//	                         tokens sent by all-to-all-v, the experts'
//	                         GEMMs, combined back; backward the reverse
type Collective struct{}

var _ Strategy = Collective{}

// Name is "collective".
func (Collective) Name() string { return "collective" }

// Supports every site kind on every group.
func (Collective) Supports(Spec) error { return nil }

// NewAllGatherMatmul builds the collective entry site.
func (Collective) NewAllGatherMatmul(sp Spec) (AllGatherMatmul, error) {
	if err := sp.check(KindAllGatherMatmul); err != nil {
		return nil, err
	}
	return &collAGMM{sp: sp}, nil
}

// NewMatmulReduceScatter builds the collective exit site.
func (Collective) NewMatmulReduceScatter(sp Spec) (MatmulReduceScatter, error) {
	if err := sp.check(KindMatmulReduceScatter); err != nil {
		return nil, err
	}
	return &collMMRS{sp: sp}, nil
}

// NewMatmulAllReduce builds the collective all-reduce site.
func (Collective) NewMatmulAllReduce(sp Spec) (MatmulAllReduce, error) {
	if err := sp.check(KindMatmulAllReduce); err != nil {
		return nil, err
	}
	return &collMMAR{sp: sp}, nil
}

type collAGMM struct {
	sp    Spec
	dFull buffer // (N, K): Σ_i dout_i·W_i before the reduce-scatter
}

func (s *collAGMM) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	if _, err := CheckAllGatherMatmul(s.sp, "forward", outs, xFull, x, ws); err != nil {
		return err
	}
	if err := gather(s.sp, "forward", xFull, x); err != nil {
		return err
	}
	for i, w := range ws {
		s.sp.Backend.MatMul(outs[i], xFull, w, false, true, 1, 0)
	}
	return nil
}

func (s *collAGMM) Backward(dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (comm.Work, error) {
	if _, err := CheckAllGatherMatmulBackward(s.sp, dx, dws, douts, xFull, ws); err != nil {
		return nil, err
	}
	b, g := s.sp.Backend, s.sp.Group
	target := dx
	if g.Size() > 1 {
		target = s.dFull.get(b, dx.DType(), xFull.Dim(0), xFull.Dim(1))
	}
	sumProducts(b, target, douts, ws, false)
	work := comm.Done
	if g.Size() > 1 { // the reduce-scatter of dx runs while the weight gradients compute
		var err error
		if work, err = reduceScatter(s.sp, "backward", dx, target); err != nil {
			return nil, err
		}
	}
	for i, dout := range douts {
		b.MatMul(dws[i], dout, xFull, true, false, 1, 1) // dW_i += dout_iᵀ·xFull
	}
	return work, nil
}

func (s *collAGMM) Close() error { s.dFull.free(s.sp.Backend); return nil }

type collMMRS struct {
	sp       Spec
	partial  buffer // (N, M) before the reduce-scatter
	doutFull buffer // (N, M) gathered output gradient
}

func (s *collMMRS) Forward(out, x, w *tensor.Tensor) error {
	if _, err := CheckMatmulReduceScatter(s.sp, "forward", out, x, w); err != nil {
		return err
	}
	b := s.sp.Backend
	if s.sp.Group.Size() == 1 {
		b.MatMul(out, x, w, false, true, 1, 0)
		return nil
	}
	partial := s.partial.get(b, out.DType(), x.Dim(0), w.Dim(0))
	b.MatMul(partial, x, w, false, true, 1, 0)
	return waitOn(s.sp)(reduceScatter(s.sp, "forward", out, partial))
}

func (s *collMMRS) Backward(dx, dw, dout, x, w *tensor.Tensor) (comm.Work, error) {
	if _, err := CheckMatmulReduceScatterBackward(s.sp, dx, dw, dout, x, w); err != nil {
		return nil, err
	}
	b := s.sp.Backend
	full := dout
	if s.sp.Group.Size() > 1 {
		full = s.doutFull.get(b, dout.DType(), x.Dim(0), dout.Dim(1))
		if err := gather(s.sp, "backward", full, dout); err != nil {
			return nil, err
		}
	}
	b.MatMul(dx, full, w, false, false, 1, 0) // dx = doutFull·w
	b.MatMul(dw, full, x, true, false, 1, 1)  // dw += doutFullᵀ·x
	return comm.Done, nil
}

func (s *collMMRS) Close() error {
	s.partial.free(s.sp.Backend)
	s.doutFull.free(s.sp.Backend)
	return nil
}

type collMMAR struct{ sp Spec }

func (s *collMMAR) Run(out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) (comm.Work, error) {
	if _, err := CheckMatmulAllReduce(s.sp, out, as, ws, transW); err != nil {
		return nil, err
	}
	sumProducts(s.sp.Backend, out, as, ws, transW)
	if s.sp.Group.Size() == 1 {
		return comm.Done, nil
	}
	return allReduce(s.sp, out)
}

func (s *collMMAR) Close() error { return nil }

// sumProducts: out = Σ_i as[i]·op(ws[i]).
func sumProducts(b tensor.Backend, out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) {
	for i := range as {
		beta := float32(1)
		if i == 0 {
			beta = 0
		}
		b.MatMul(out, as[i], ws[i], false, transW, 1, beta)
	}
}

// gather all-gathers src into dst and orders it on the spec's stream (a
// copy on a group of one rank).
func gather(sp Spec, op string, dst, src *tensor.Tensor) error {
	if sp.Group.Size() == 1 {
		if !sameView(dst, src) {
			sp.Backend.Copy(dst, src)
		}
		return nil
	}
	w, err := sp.Group.AllGather(dst, src, sp.Stream)
	return waitOn(sp)(w, wrapErr(sp, op, err))
}

func reduceScatter(sp Spec, op string, dst, src *tensor.Tensor) (comm.Work, error) {
	w, err := sp.Group.ReduceScatter(dst, src, comm.Sum, sp.Stream)
	return w, wrapErr(sp, op, err)
}

func allReduce(sp Spec, buf *tensor.Tensor) (comm.Work, error) {
	w, err := sp.Group.AllReduce(buf, comm.Sum, sp.Stream)
	return w, wrapErr(sp, "run", err)
}

func wrapErr(sp Spec, op string, err error) error {
	if err != nil {
		return fmt.Errorf("%s %s: %w", sp.what(), op, err)
	}
	return nil
}

// waitOn waits for a Work on the spec's stream.
func waitOn(sp Spec) func(comm.Work, error) error {
	return func(w comm.Work, err error) error {
		if err != nil {
			return err
		}
		return w.Wait(sp.Stream)
	}
}
