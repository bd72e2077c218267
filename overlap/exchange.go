package overlap

import (
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Exchange is the pipelined strategy's form on any transport (PyTorch's
// symmetric-memory decomposition, on two-sided exchanges; the registry's
// strategies.Pipelined runs it where a group has no peer pointers): the collective
// is cut into P−1 exchange steps, and the math of each chunk runs as soon
// as its step has landed, while the next step moves on the site's lane (a
// side stream on the GPU, a goroutine on the CPU).
//
//   - all-gather∘matmul: the own shard's matmul first; step s brings the
//     shard of rank r−s (every rank sends its own shard to r+s), and its
//     matmul follows.
//   - matmul∘reduce-scatter: step s computes the partial product of rank
//     r+s's rows and sends it while the next one computes; the own rows'
//     product last, then the received partials are added in step order.
//   - matmul∘all-reduce: the rows in Chunks chunks, each all-reduced while
//     the next one computes.
//
// The backwards are the adjoints: the entry's backward is a pipelined
// matmul∘reduce-scatter, the exit's a pipelined all-gather∘matmul.
// Exchange steps are all-to-all-v calls with one peer each, so every
// transport runs it. The sums differ from the collective's only by the
// order of rounding. It is a Builder, not a Strategy: the name
// "pipelined" is strategies.Pipelined's.
type Exchange struct {
	// Chunks is the number of row chunks of matmul∘all-reduce; 0 means 4.
	Chunks int
}

var (
	_ Builder   = Exchange{}
	_ Describer = Exchange{}
)

// Supports every TP site kind; the MoE expert path's pipelined form is the
// device-side dispatch over symmetric memory (parallel/ep/peerep), which
// needs NVSHMEM and the CUDA backend: not this transport-generic form.
func (Exchange) Supports(sp Spec) error {
	if sp.Kind == KindExpert {
		return unavailable("pipelined", sp.Kind, ExpertNeedsSymmetric)
	}
	return nil
}

// ExpertNeedsSymmetric is why the expert path keeps collective where the
// pipelined strategy is the transport-generic one.
const ExpertNeedsSymmetric = "the pipelined expert path needs symmetric memory (comm.SymmetricMemory: the NVSHMEM transport) and the CUDA backend"

// Via says how a site moves its data (Describer): exchanges on the
// group's collectives, chunked all-reduces for matmul∘all-reduce.
func (Exchange) Via(sp Spec) (string, bool) {
	if sp.Kind == KindMatmulAllReduce {
		return "chunked all-reduces on the group's collectives", false
	}
	return "exchanges on the group's collectives", false
}

// NewAllGatherMatmul builds the pipelined entry site.
func (p Exchange) NewAllGatherMatmul(sp Spec) (AllGatherMatmul, error) {
	l, err := newSiteLane(sp, KindAllGatherMatmul)
	if err != nil {
		return nil, err
	}
	return &pipeAGMM{sp: sp, lane: l}, nil
}

// NewMatmulReduceScatter builds the pipelined exit site.
func (p Exchange) NewMatmulReduceScatter(sp Spec) (MatmulReduceScatter, error) {
	l, err := newSiteLane(sp, KindMatmulReduceScatter)
	if err != nil {
		return nil, err
	}
	return &pipeMMRS{sp: sp, lane: l}, nil
}

// NewMatmulAllReduce builds the pipelined all-reduce site.
func (p Exchange) NewMatmulAllReduce(sp Spec) (MatmulAllReduce, error) {
	l, err := newSiteLane(sp, KindMatmulAllReduce)
	if err != nil {
		return nil, err
	}
	chunks := p.Chunks
	if chunks <= 0 {
		chunks = 4
	}
	return &pipeMMAR{sp: sp, lane: l, chunks: chunks}, nil
}

// shift is exchange step s of P: this rank sends src to rank r+s and
// receives dst from rank r−s (mod P).
func shift(g comm.Comm, dst, src *tensor.Tensor, s int, st comm.Stream) (comm.Work, error) {
	P, r := g.Size(), g.Rank()
	send, recv := make([]int, P), make([]int, P)
	send[(r+s)%P] = src.Dim(0)
	recv[(r-s+P)%P] = dst.Dim(0)
	return g.AllToAllV(dst, src, send, recv, st)
}

// part is the rows of rank q, n rows each.
func part(t *tensor.Tensor, q, n int) *tensor.Tensor { return rows(t, q*n, (q+1)*n) }

func parts(ts []*tensor.Tensor, q, n int) []*tensor.Tensor {
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		out[i] = part(t, q, n)
	}
	return out
}

// partials is what a pipelined site that sums its peers' partial rows
// owns besides its lane: the (P−1)·n partial rows out and in, and the
// accumulator of the received ones.
type partials struct {
	send, recv buffer
	sum        Accumulator
}

// addSteps adds into dst, in step order, each step's partial rows (recv's
// part st−1 of n rows) as the step lands; it stops at the first failed
// step and returns its error.
func (p *partials) addSteps(b tensor.Backend, dst, recv *tensor.Tensor, n int, steps []comm.Work, s comm.Stream) error {
	var err error
	p.sum.Begin(b, dst)
	for st := 1; st < len(steps) && err == nil; st++ {
		if err = steps[st].Wait(s); err == nil {
			p.sum.Add(part(recv, st-1, n))
		}
	}
	p.sum.End()
	return err
}

func (p *partials) free(b tensor.Backend) {
	p.sum.Free(b)
	p.send.free(b)
	p.recv.free(b)
}

type pipeAGMM struct {
	sp       Spec
	lane     *siteLane
	partials // backward: the partial dx rows
}

func (s *pipeAGMM) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	n, err := CheckAllGatherMatmul(s.sp, "forward", outs, xFull, x, ws)
	if err != nil {
		return err
	}
	b, g := s.sp.Backend, s.sp.Group
	P, r := g.Size(), g.Rank()
	if own := part(xFull, r, n); !sameView(own, x) {
		b.Copy(own, x)
	}
	s.lane.begin()
	steps := make([]comm.Work, P)
	for st := 1; st < P; st++ {
		dst := part(xFull, (r-st+P)%P, n)
		steps[st] = s.lane.run(func(cs comm.Stream) (comm.Work, error) { return shift(g, dst, x, st, cs) })
	}
	for i, w := range ws { // the own shard first: nothing to wait for
		b.MatMul(part(outs[i], r, n), x, w, false, true, 1, 0)
	}
	for st := 1; st < P && err == nil; st++ {
		if err = steps[st].Wait(s.sp.Stream); err != nil {
			break
		}
		q := (r - st + P) % P
		for i, w := range ws {
			b.MatMul(part(outs[i], q, n), part(xFull, q, n), w, false, true, 1, 0)
		}
	}
	return s.lane.finish(err, "forward")
}

func (s *pipeAGMM) Backward(dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (comm.Work, error) {
	n, err := CheckAllGatherMatmulBackward(s.sp, dx, dws, douts, xFull, ws)
	if err != nil {
		return nil, err
	}
	b, g := s.sp.Backend, s.sp.Group
	P, r, k := g.Size(), g.Rank(), dx.Dim(1)
	send := s.send.get(b, dx.DType(), (P-1)*n, k)
	recv := s.recv.get(b, dx.DType(), (P-1)*n, k)
	s.lane.begin()
	steps := make([]comm.Work, P)
	for st := 1; st < P; st++ { // rank r+s's rows of Σ_i dout_i·W_i, sent as soon as computed
		out, in := part(send, st-1, n), part(recv, st-1, n)
		sumProducts(b, out, parts(douts, (r+st)%P, n), ws, false)
		steps[st] = s.lane.run(func(cs comm.Stream) (comm.Work, error) { return shift(g, in, out, st, cs) })
	}
	sumProducts(b, dx, parts(douts, r, n), ws, false)
	for i, dout := range douts { // the weight gradients while the last steps move
		b.MatMul(dws[i], dout, xFull, true, false, 1, 1)
	}
	err = s.addSteps(b, dx, recv, n, steps, s.sp.Stream)
	if err := s.lane.finish(err, "backward"); err != nil {
		return nil, err
	}
	return comm.Done, nil
}

func (s *pipeAGMM) Close() error {
	s.free(s.sp.Backend)
	return s.lane.close()
}

type pipeMMRS struct {
	sp       Spec
	lane     *siteLane
	partials        // forward: the partial rows
	doutFull buffer // backward: (N, M) the gathered output gradient
}

func (s *pipeMMRS) Forward(out, x, w *tensor.Tensor) error {
	n, err := CheckMatmulReduceScatter(s.sp, "forward", out, x, w)
	if err != nil {
		return err
	}
	b, g := s.sp.Backend, s.sp.Group
	P, r, m := g.Size(), g.Rank(), w.Dim(0)
	send := s.send.get(b, out.DType(), (P-1)*n, m)
	recv := s.recv.get(b, out.DType(), (P-1)*n, m)
	s.lane.begin()
	steps := make([]comm.Work, P)
	for st := 1; st < P; st++ {
		o, in := part(send, st-1, n), part(recv, st-1, n)
		b.MatMul(o, part(x, (r+st)%P, n), w, false, true, 1, 0)
		steps[st] = s.lane.run(func(cs comm.Stream) (comm.Work, error) { return shift(g, in, o, st, cs) })
	}
	b.MatMul(out, part(x, r, n), w, false, true, 1, 0)
	err = s.addSteps(b, out, recv, n, steps, s.sp.Stream)
	return s.lane.finish(err, "forward")
}

func (s *pipeMMRS) Backward(dx, dw, dout, x, w *tensor.Tensor) (comm.Work, error) {
	n, err := CheckMatmulReduceScatterBackward(s.sp, dx, dw, dout, x, w)
	if err != nil {
		return nil, err
	}
	b, g := s.sp.Backend, s.sp.Group
	P, r := g.Size(), g.Rank()
	full := s.doutFull.get(b, dout.DType(), P*n, dout.Dim(1))
	s.lane.begin()
	steps := make([]comm.Work, P)
	for st := 1; st < P; st++ {
		dst := part(full, (r-st+P)%P, n)
		steps[st] = s.lane.run(func(cs comm.Stream) (comm.Work, error) { return shift(g, dst, dout, st, cs) })
	}
	chunk := func(q int, d *tensor.Tensor) {
		b.MatMul(part(dx, q, n), d, w, false, false, 1, 0) // dx rows q = dout_q·w
		b.MatMul(dw, d, part(x, q, n), true, false, 1, 1)  // dw += dout_qᵀ·x rows q
	}
	chunk(r, dout)
	for st := 1; st < P && err == nil; st++ {
		if err = steps[st].Wait(s.sp.Stream); err == nil {
			q := (r - st + P) % P
			chunk(q, part(full, q, n))
		}
	}
	if err := s.lane.finish(err, "backward"); err != nil {
		return nil, err
	}
	return comm.Done, nil
}

func (s *pipeMMRS) Close() error {
	s.free(s.sp.Backend)
	s.doutFull.free(s.sp.Backend)
	return s.lane.close()
}

type pipeMMAR struct {
	sp     Spec
	lane   *siteLane
	chunks int
}

func (s *pipeMMAR) Run(out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) (comm.Work, error) {
	R, err := CheckMatmulAllReduce(s.sp, out, as, ws, transW)
	if err != nil {
		return nil, err
	}
	b, g := s.sp.Backend, s.sp.Group
	if g.Size() == 1 || R == 0 {
		sumProducts(b, out, as, ws, transW)
		return comm.Done, nil
	}
	chunks := min(s.chunks, R)
	s.lane.begin()
	for c := range chunks {
		lo, hi := c*R/chunks, (c+1)*R/chunks
		o := rows(out, lo, hi)
		in := make([]*tensor.Tensor, len(as))
		for i, a := range as {
			in[i] = rows(a, lo, hi)
		}
		sumProducts(b, o, in, ws, transW)
		s.lane.run(func(cs comm.Stream) (comm.Work, error) { return g.AllReduce(o, comm.Sum, cs) })
	}
	return errWork{s.lane.end(), s.sp}, nil
}

func (s *pipeMMAR) Close() error { return s.lane.close() }

// errWork names the site in its Work's error.
type errWork struct {
	w  comm.Work
	sp Spec
}

func (w errWork) Wait(s comm.Stream) error { return wrapErr(w.sp, "run", w.w.Wait(s)) }

func unavailable(strategy string, k Kind, why string) error {
	return &unavailableError{strategy, k, why}
}

type unavailableError struct {
	strategy string
	kind     Kind
	why      string
}

func (e *unavailableError) Error() string {
	return "overlap: " + e.strategy + " for " + string(e.kind) + " sites: " + e.why
}

func (e *unavailableError) Unwrap() error { return ErrUnavailable }
