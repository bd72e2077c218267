package peercopy

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Chunked builds the TP sites of the pipelined strategy on a group with
// symmetric memory and peer pointers (NVSHMEM, PEs of one node; the
// registry's strategies.Pipelined picks it there): the same schedule as
// overlap.Exchange — the own shard's math first, then each peer's chunk
// as it lands, a GEMM per chunk, P−1 steps — but every chunk is a
// copy-engine pull from the peer's symmetric stage, gated by 64-bit
// signal words written and waited with stream memory operations
// (exchange), instead of a two-sided exchange through the transport. The
// matmul∘all-reduce sites are overlap.Exchange's (chunked all-reduces
// through the transport). A Builder without a name: "pipelined" is
// strategies.Pipelined's.
type Chunked struct {
	// Chunks is the matmul∘all-reduce sites' row chunks (0: 4;
	// overlap.Exchange.Chunks).
	Chunks int
}

var _ overlap.Builder = Chunked{}

// Supports needs the CUDA backend on a CUDA stream and a group with
// symmetric memory; the expert path is parallel/ep/peerep's.
func (Chunked) Supports(sp overlap.Spec) error {
	_, err := env(sp)
	return err
}

func env(sp overlap.Spec) (siteEnv, error) {
	return envAs(sp, fmt.Sprintf("peer-copy pipelined %s site %q", sp.Kind, sp.Name))
}

// envAs is env with its errors named what (the strategy's site).
func envAs(sp overlap.Spec, what string) (siteEnv, error) {
	if sp.Kind == overlap.KindExpert {
		return siteEnv{}, fmt.Errorf("%s: the expert path is parallel/ep/peerep's (%w)", what, overlap.ErrUnavailable)
	}
	b, ok := sp.Backend.(*cudabackend.Backend)
	if !ok || (b.OnGPU() && b.Stream() == nil) {
		return siteEnv{}, fmt.Errorf("%s: backend %T: expected the CUDA backend on a CUDA stream, over a transport with symmetric memory (comm.SymmetricMemory: the NVSHMEM transport) (%w)", what, sp.Backend, overlap.ErrUnavailable)
	}
	if sp.Group == nil {
		return siteEnv{}, fmt.Errorf("%s: nil group", what)
	}
	if err := errors.Join(errCheckPut, errCheckWait); err != nil {
		return siteEnv{}, fmt.Errorf("%s: %w", what, err)
	}
	sm, ok := comm.SymmetricOf(sp.Group)
	if !ok {
		return siteEnv{}, fmt.Errorf("%s: group %s has no symmetric memory (comm.SymmetricMemory: the NVSHMEM transport has it) (%w)", what, sp.Group.Name(), overlap.ErrUnavailable)
	}
	return siteEnv{g: sp.Group, sm: sm, b: b, what: what}, nil
}

func newEnv(sp overlap.Spec) (siteEnv, error) {
	e, err := env(sp)
	if err != nil {
		return e, err
	}
	return newSide(e)
}

// newSide gives e its side stream; on the kernel emulator, whose one
// stream runs the work in issue order, it has none (the side stream's work
// goes to the backend's).
func newSide(e siteEnv) (siteEnv, error) {
	if !e.b.OnGPU() {
		return e, nil
	}
	s, err := e.b.NewStream()
	if err != nil {
		return e, fmt.Errorf("%s: side stream: %w", e.what, err)
	}
	e.side = s.(*cuda.Stream)
	return e, nil
}

func (e siteEnv) close(xs ...*exchange) error {
	var errs []error
	for _, x := range xs {
		errs = append(errs, x.release())
	}
	if e.side != nil {
		errs = append(errs, e.b.DestroyStream(e.side))
	}
	return errors.Join(errs...)
}

// NewAllGatherMatmul builds the entry site.
func (Chunked) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	e, err := newEnv(sp)
	if err != nil {
		return nil, err
	}
	return &agmm{sp: sp, e: e, fwd: &exchange{sp: e, slots: 1}, bwd: &exchange{sp: e, slots: sp.Group.Size()}}, nil
}

// NewMatmulReduceScatter builds the exit site.
func (Chunked) NewMatmulReduceScatter(sp overlap.Spec) (overlap.MatmulReduceScatter, error) {
	e, err := newEnv(sp)
	if err != nil {
		return nil, err
	}
	return &mmrs{sp: sp, e: e, fwd: &exchange{sp: e, slots: sp.Group.Size()}, bwd: &exchange{sp: e, slots: 1}}, nil
}

// NewMatmulAllReduce is overlap.Exchange's site.
func (c Chunked) NewMatmulAllReduce(sp overlap.Spec) (overlap.MatmulAllReduce, error) {
	if _, err := env(sp); err != nil {
		return nil, err
	}
	return overlap.Exchange{Chunks: c.Chunks}.NewMatmulAllReduce(sp)
}

// ownRows is rows [q·n, (q+1)·n) of t.
func ownRows(t *tensor.Tensor, q, n int) *tensor.Tensor {
	v, _ := t.Rows(q*n, (q+1)*n)
	return v
}

func rowsOf(ts []*tensor.Tensor, q, n int) []*tensor.Tensor {
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		out[i] = ownRows(t, q, n)
	}
	return out
}

func sumProducts(b tensor.Backend, out *tensor.Tensor, as, ws []*tensor.Tensor) {
	for i := range as {
		beta := float32(1)
		if i == 0 {
			beta = 0
		}
		b.MatMul(out, as[i], ws[i], false, false, 1, beta)
	}
}

// gatherInto publishes src (n rows) in x's stage and pulls every peer's
// into its rows of full (P·n rows; the own rows are copied), returning the
// Work of each step (index s: the rows of rank r−s). A non-zero landed is
// the fused strategy's: each pull then raises rank q's landed word.
func gatherInto(x *exchange, full, src *tensor.Tensor, landed, issued uint64) ([]comm.Work, error) {
	g, b := x.sp.g, x.sp.b
	P, r, n := g.Size(), g.Rank(), src.Dim(0)
	if err := x.ensure(n, src.Dim(1), src.DType()); err != nil {
		return nil, err
	}
	x.begin()
	if err := x.reserve(0); err != nil {
		return nil, err
	}
	b.Copy(x.slot(0, n), src)
	if err := x.publish(0); err != nil {
		return nil, err
	}
	if own := ownRows(full, r, n); own.Buffer() != src.Buffer() || own.Offset() != src.Offset() {
		b.Copy(own, src)
	}
	steps := make([]comm.Work, P)
	for s := 1; s < P; s++ {
		q := (r - s + P) % P
		mark := uint64(0)
		if s == P-1 {
			mark = issued
		}
		w, err := x.pullWith(s, q, ownRows(full, q, n), true, landed, mark)
		if err != nil {
			return nil, err
		}
		steps[s] = w
	}
	return steps, nil
}

// scatterSum computes, for each destination d = r+s, its rows of a
// product (partial(dst, d)) into x's stage slot for d, publishes it, and
// pulls the partial of rank r−s for this rank into recv; then own(out)
// computes this rank's rows and the received partials are added in step
// order. between runs after the own rows (the weight gradients).
func scatterSum(x *exchange, sum *overlap.Accumulator, recv, out *tensor.Tensor, partial func(dst *tensor.Tensor, d int), own func(), between func()) error {
	g, b := x.sp.g, x.sp.b
	P, r, n := g.Size(), g.Rank(), out.Dim(0)
	if err := x.ensure(n, out.Dim(1), out.DType()); err != nil {
		return err
	}
	x.begin()
	steps := make([]comm.Work, P)
	for s := 1; s < P; s++ {
		d := (r + s) % P
		if err := x.reserve(d); err != nil {
			return err
		}
		partial(x.slot(d, n), d)
		if err := x.publish(d); err != nil {
			return err
		}
		w, err := x.pull(s, (r-s+P)%P, ownRows(recv, s-1, n))
		if err != nil {
			return err
		}
		steps[s] = w
	}
	own()
	if between != nil {
		between()
	}
	sum.Begin(b, out)
	for s := 1; s < P; s++ {
		if err := steps[s].Wait(nil); err != nil {
			return err
		}
		sum.Add(ownRows(recv, s-1, n))
	}
	sum.End()
	return nil
}

// buffer is a local scratch tensor that grows to the largest request.
type buffer struct{ t *tensor.Tensor }

func (p *buffer) get(b tensor.Backend, dt tensor.DType, r, c int) *tensor.Tensor {
	if p.t == nil || p.t.DType() != dt || p.t.Dim(1) != c || p.t.Dim(0) < r {
		if p.t != nil {
			b.Free(p.t)
		}
		p.t = b.Zeros(dt, max(r, 1), c)
	}
	v, _ := p.t.Rows(0, r)
	return v
}

type agmm struct {
	sp       overlap.Spec
	e        siteEnv
	fwd, bwd *exchange
	recv     buffer
	sum      overlap.Accumulator
	generic  overlap.AllGatherMatmul // P = 1
}

func (s *agmm) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	n, err := overlap.CheckAllGatherMatmul(s.sp, "forward", outs, xFull, x, ws)
	if err != nil || s.sp.Group.Size() == 1 {
		return s.fallback().Forward(outs, xFull, x, ws) // the same checks, and P = 1
	}
	b, r := s.e.b, s.sp.Group.Rank()
	steps, err := gatherInto(s.fwd, xFull, x, 0, 0)
	if err != nil {
		return err
	}
	for i, w := range ws {
		b.MatMul(ownRows(outs[i], r, n), x, w, false, true, 1, 0)
	}
	P := s.sp.Group.Size()
	for st := 1; st < P; st++ {
		if err := steps[st].Wait(nil); err != nil {
			return err
		}
		q := (r - st + P) % P
		for i, w := range ws {
			b.MatMul(ownRows(outs[i], q, n), ownRows(xFull, q, n), w, false, true, 1, 0)
		}
	}
	return nil
}

func (s *agmm) Backward(dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (comm.Work, error) {
	n, err := overlap.CheckAllGatherMatmulBackward(s.sp, dx, dws, douts, xFull, ws)
	if err != nil || s.sp.Group.Size() == 1 {
		return s.fallback().Backward(dx, dws, douts, xFull, ws)
	}
	b, P := s.e.b, s.sp.Group.Size()
	recv := s.recv.get(b, dx.DType(), (P-1)*n, dx.Dim(1))
	err = scatterSum(s.bwd, &s.sum, recv, dx,
		func(dst *tensor.Tensor, d int) { sumProducts(b, dst, rowsOf(douts, d, n), ws) },
		func() { sumProducts(b, dx, rowsOf(douts, s.sp.Group.Rank(), n), ws) },
		func() {
			for i, dout := range douts {
				b.MatMul(dws[i], dout, xFull, true, false, 1, 1)
			}
		})
	if err != nil {
		return nil, err
	}
	return comm.Done, nil
}

// fallback is the generic site for a group of one rank and for calls the
// checks refuse.
func (s *agmm) fallback() overlap.AllGatherMatmul {
	if s.generic == nil {
		s.generic, _ = overlap.Collective{}.NewAllGatherMatmul(s.sp)
	}
	return s.generic
}

func (s *agmm) Close() error {
	s.sum.Free(s.e.b)
	if s.recv.t != nil {
		s.e.b.Free(s.recv.t)
		s.recv.t = nil
	}
	var gerr error
	if s.generic != nil { // the fallback's gathered buffer
		gerr, s.generic = s.generic.Close(), nil
	}
	return errors.Join(gerr, s.e.close(s.fwd, s.bwd))
}

type mmrs struct {
	sp       overlap.Spec
	e        siteEnv
	fwd, bwd *exchange
	recv     buffer
	full     buffer
	sum      overlap.Accumulator
	generic  overlap.MatmulReduceScatter
}

func (s *mmrs) fallback() overlap.MatmulReduceScatter {
	if s.generic == nil {
		s.generic, _ = overlap.Collective{}.NewMatmulReduceScatter(s.sp)
	}
	return s.generic
}

func (s *mmrs) Forward(out, x, w *tensor.Tensor) error {
	P := s.sp.Group.Size()
	n, err := overlap.CheckMatmulReduceScatter(s.sp, "forward", out, x, w)
	if err != nil || P == 1 {
		return s.fallback().Forward(out, x, w)
	}
	b, r := s.e.b, s.sp.Group.Rank()
	recv := s.recv.get(b, out.DType(), (P-1)*n, out.Dim(1))
	return scatterSum(s.fwd, &s.sum, recv, out,
		func(dst *tensor.Tensor, d int) { b.MatMul(dst, ownRows(x, d, n), w, false, true, 1, 0) },
		func() { b.MatMul(out, ownRows(x, r, n), w, false, true, 1, 0) }, nil)
}

func (s *mmrs) Backward(dx, dw, dout, x, w *tensor.Tensor) (comm.Work, error) {
	P := s.sp.Group.Size()
	n, err := overlap.CheckMatmulReduceScatterBackward(s.sp, dx, dw, dout, x, w)
	if err != nil || P == 1 {
		return s.fallback().Backward(dx, dw, dout, x, w)
	}
	b, r := s.e.b, s.sp.Group.Rank()
	full := s.full.get(b, dout.DType(), P*n, dout.Dim(1))
	steps, err := gatherInto(s.bwd, full, dout, 0, 0)
	if err != nil {
		return nil, err
	}
	chunk := func(q int) {
		d := ownRows(full, q, n)
		b.MatMul(ownRows(dx, q, n), d, w, false, false, 1, 0)
		b.MatMul(dw, d, ownRows(x, q, n), true, false, 1, 1)
	}
	chunk(r)
	for st := 1; st < P; st++ {
		if err := steps[st].Wait(nil); err != nil {
			return nil, err
		}
		chunk((r - st + P) % P)
	}
	return comm.Done, nil
}

func (s *mmrs) Close() error {
	s.sum.Free(s.e.b)
	for _, t := range []*tensor.Tensor{s.recv.t, s.full.t} {
		if t != nil {
			s.e.b.Free(t)
		}
	}
	s.recv.t, s.full.t = nil, nil
	var gerr error
	if s.generic != nil { // the fallback's buffers
		gerr, s.generic = s.generic.Close(), nil
	}
	return errors.Join(gerr, s.e.close(s.fwd, s.bwd))
}
