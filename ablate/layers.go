package ablate

import (
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/rowmajor"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/parallel/shard"
	ptp "github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
)

// The layer cells: one TP block forward + backward (parallel/tp), one MoE
// block forward + backward (parallel/model's: TP attention and the
// parallel/ep MoE, whose expert path stays collective while the TP sites
// take the cell's strategy), and one training step of the sharded model
// (parallel/model: forward, backward, gradient reduction, then
// optim.AdamW's update). Each strategy builds its own layer from the same
// seed; the collective's outputs are checked against the unsharded layers
// (layers.Block, layers.GPT + AdamW on one rank, same seed, same inputs, on
// the same backend and dtype), every other strategy against the
// collective's.

func (s Shape) layerString() string {
	str := fmt.Sprintf("%s M=%d d=%d ffn=%d h=%d T=%d", s.Name, s.M, s.N, s.K, s.Heads, s.Seq)
	if s.Experts > 0 {
		str += fmt.Sprintf(" E=%d top%d", s.Experts, s.TopK)
	}
	if s.Vocab > 0 {
		str += fmt.Sprintf(" V=%d L=%d", s.Vocab, s.Layers)
	}
	return str
}

// layerRunnable says why a layer cell cannot run, or "".
func layerRunnable(c Cell) string {
	P, s := c.World, c.Shape
	switch {
	case s.Seq < 1 || s.M%s.Seq != 0:
		return fmt.Sprintf("M %d is not a whole number of sequences of %d tokens", s.M, s.Seq)
	case (c.Dir == "sp" || s.Experts > 0) && s.M%P != 0:
		return fmt.Sprintf("M %d is not divisible by world %d", s.M, P)
	case s.Heads < 1 || s.N%s.Heads != 0 || (s.N/s.Heads)%2 != 0:
		return fmt.Sprintf("width %d and %d heads: expected an even head width", s.N, s.Heads)
	case s.Heads%P != 0:
		return fmt.Sprintf("%d heads are not divisible by world %d", s.Heads, P)
	case s.K%P != 0:
		return fmt.Sprintf("FFN width %d is not divisible by world %d", s.K, P)
	case s.Experts > 0 && s.Experts%P != 0:
		return fmt.Sprintf("%d experts are not divisible by world %d", s.Experts, P)
	case s.Vocab > 0 && s.Vocab%P != 0:
		return fmt.Sprintf("vocabulary %d is not divisible by world %d", s.Vocab, P)
	}
	return ""
}

// layerTolerance bounds the relative error of a layer cell: whole layers
// (norms, softmax, SwiGLU, the update) amplify the summation-order
// differences of sharding more than one GEMM does.
func layerTolerance(dt tensor.DType) float64 {
	switch dt {
	case tensor.Float64:
		return 1e-10
	case tensor.Float32:
		return 1e-4
	}
	return 5e-2
}

// The step's optimizer: AdamW at a fixed rate.
var (
	stepAdam = optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	stepLR   = 1e-3
)

// layerCase is one rank's side of a layer cell group.
type layerCase struct {
	op         Op
	g          gen
	b          tensor.Backend
	grp        comm.Comm
	st         comm.Stream
	dt         tensor.DType
	sp         bool
	P, me      int
	M, n       int // global tokens; this rank's rows (M/P under sequence parallelism)
	batch, seq int
	cfg        layers.GPTConfig // defaults filled in
	bc         layers.BlockConfig
	x, dout    *tensor.Tensor // this rank's rows of the block's input and output gradient
	ids, tgts  *tensor.Tensor // host (batch, seq): the step's global batch
	ref        layerRef
	cur        *layerInst
}

// layerRef is the unsharded layers' result, in float64: the block's
// output and input gradient (all M rows), and per parameter its gradient
// (the step: also its weights after the update, and the loss).
type layerRef struct {
	out, dx []float64
	grads   map[string][]float64
	weights map[string][]float64
	loss    float64
}

// layerInst is one strategy's layer.
type layerInst struct {
	grid    *comm.Grid
	ps      *layers.ParamSet
	blk     model.Block
	m       *model.Model
	opt     *optim.AdamW
	shards  []shard.Shard
	out, dx *tensor.Tensor
	step    int
	loss    float64
}

func newLayerCase(c Cell, g gen, b tensor.Backend, grp comm.Comm, st comm.Stream) (opCase, error) {
	s := c.Shape
	P := grp.Size()
	l := &layerCase{op: c.Op, g: g, b: b, grp: grp, st: st, dt: g.dt, sp: c.Dir == "sp", P: P, me: grp.Rank(), M: s.M,
		seq: s.Seq, batch: s.M / s.Seq}
	l.n = s.M
	if l.sp {
		l.n = s.M / P
	}
	cfg := layers.GPTConfig{Layers: 1, Dim: s.N, Heads: s.Heads, FFN: s.K, Seq: s.Seq, Vocab: 8 * P, Seed: g.seed, InitStd: 0.05}
	switch c.Op {
	case OpMoELayer:
		cfg.Experts, cfg.TopK, cfg.MoEEvery = s.Experts, s.TopK, 1
	case OpTrainStep:
		cfg.Layers, cfg.Vocab = s.Layers, s.Vocab
	}
	l.cfg = cfg.WithDefaults()
	if err := l.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ablate: %s: %w", c.ID(), err)
	}
	std := l.cfg.InitStd
	l.bc = layers.BlockConfig{Dim: l.cfg.Dim, Heads: l.cfg.Heads, FFN: l.cfg.FFN, RopeTheta: l.cfg.RopeTheta, NormEps: l.cfg.NormEps,
		Std: std, OutStd: std / math.Sqrt(2*float64(l.cfg.Layers))}
	if c.Op == OpMoELayer {
		mc := l.cfg.MoEConfig()
		l.bc.MoE = &mc
	}
	var err error
	if c.Op == OpTrainStep {
		ids, tgts := make([]int32, s.M), make([]int32, s.M)
		for i := range ids {
			ids[i] = int32(splitmix(g.seed^whatHash("step.ids")^uint64(i)) % uint64(s.Vocab))
			tgts[i] = int32(splitmix(g.seed^whatHash("step.targets")^uint64(i)) % uint64(s.Vocab))
		}
		if l.ids, err = tensor.FromInt32(ids, l.batch, l.seq); err != nil {
			return nil, err
		}
		if l.tgts, err = tensor.FromInt32(tgts, l.batch, l.seq); err != nil {
			return nil, err
		}
	} else {
		off := 0
		if l.sp {
			off = l.me * l.n
		}
		if l.x, err = g.upload(b, "layer.x", 0, l.n, s.N, off); err != nil {
			return nil, err
		}
		if l.dout, err = g.upload(b, "layer.dout", 0, l.n, s.N, off); err != nil {
			return nil, err
		}
	}
	if err := l.reference(); err != nil {
		return nil, fmt.Errorf("ablate: %s: the unsharded reference: %w", c.ID(), err)
	}
	return l, nil
}

// reference runs the unsharded layers on one rank's backend.
func (l *layerCase) reference() error {
	b, dt := l.b, l.dt
	l.ref = layerRef{grads: map[string][]float64{}, weights: map[string][]float64{}}
	var ps *layers.ParamSet
	if l.op == OpTrainStep {
		m, err := layers.NewGPT(b, l.cfg, dt)
		if err != nil {
			return err
		}
		if l.ref.loss, err = m.Forward(l.ids, l.tgts); err != nil {
			return err
		}
		if err := m.Backward(); err != nil {
			return err
		}
		opt, err := optim.NewAdamWWithConfig(b, m.Params(), stepAdam)
		if err != nil {
			return err
		}
		ps = m.Params()
		for _, p := range ps.Params() {
			if l.ref.grads[p.Name], err = download(b, p.G); err != nil {
				return err
			}
		}
		if err := opt.Step(1, stepLR, 1); err != nil {
			return err
		}
		for _, p := range ps.Params() {
			if l.ref.weights[p.Name], err = download(b, p.W); err != nil {
				return err
			}
		}
		return b.Err()
	}
	ps = layers.NewParamSet(l.cfg.Seed)
	blk, err := layers.NewBlock(b, ps, "blocks.0", l.bc)
	if err != nil {
		return err
	}
	if err := ps.Materialize(b, dt); err != nil {
		return err
	}
	x, err := l.g.upload(b, "layer.x", 0, l.M, l.cfg.Dim, 0)
	if err != nil {
		return err
	}
	dout, err := l.g.upload(b, "layer.dout", 0, l.M, l.cfg.Dim, 0)
	if err != nil {
		return err
	}
	out, dx := b.Zeros(dt, l.M, l.cfg.Dim), b.Zeros(dt, l.M, l.cfg.Dim)
	defer func() {
		for _, t := range []*tensor.Tensor{x, dout, out, dx} {
			b.Free(t)
		}
	}()
	if err := blk.ForwardSeq(out, x, l.batch, l.seq); err != nil {
		return err
	}
	if err := blk.Backward(dx, dout); err != nil {
		return err
	}
	if l.ref.out, err = download(b, out); err != nil {
		return err
	}
	if l.ref.dx, err = download(b, dx); err != nil {
		return err
	}
	for _, p := range ps.Params() {
		if l.ref.grads[p.Name], err = download(b, p.G); err != nil {
			return err
		}
	}
	return b.Err()
}

func (l *layerCase) site(s overlap.Strategy) (func() error, func() error, error) {
	ch := overlap.Single(s)
	in := &layerInst{}
	closeInst := func() error {
		var err error
		if in.m != nil {
			err = in.m.Close() // its sites too
		} else if c, ok := in.blk.(io.Closer); ok {
			// a bare TP block's sites (side streams, symmetric buffers: a
			// collective free, in the same order on every rank), once the
			// device work that uses them is done
			err = errors.Join(l.b.Sync(), c.Close())
		}
		if in.grid != nil {
			err = errors.Join(err, in.grid.Close())
		}
		*in = layerInst{}
		l.cur = nil
		runtime.GC() // the GPU backend gives a buffer back once it is unreachable
		return err
	}
	var err error
	switch l.op {
	case OpTPBlock:
		in.ps = layers.NewParamSet(l.cfg.Seed)
		par := ptp.Parallel{Group: l.grp, Overlap: ch, SequenceParallel: l.sp, Stream: l.st}
		var blk *ptp.Block
		if blk, err = ptp.NewBlock(l.b, in.ps, par, "blocks.0", l.bc); err == nil {
			in.blk = blk
			err = in.ps.Materialize(l.b, l.dt)
		}
	case OpMoELayer, OpTrainStep:
		ep := 1
		if l.op == OpMoELayer {
			ep = l.P
		}
		if in.grid, err = comm.NewGrid(l.grp, 1, l.P, ep); err != nil {
			return nil, nil, err
		}
		in.m, err = model.New(l.b, in.grid, l.cfg, model.Options{SequenceParallel: l.sp, Overlap: ch, Stream: l.st}, l.dt)
		if err == nil && l.op == OpMoELayer {
			in.blk, in.ps = in.m.Blocks[0], in.m.Params()
		}
		if err == nil && l.op == OpTrainStep {
			in.ps, in.shards = in.m.Params(), in.m.Shards()
			in.opt, err = optim.NewAdamWWithConfig(l.b, in.ps, stepAdam)
		}
	}
	if err != nil {
		closeInst()
		return nil, nil, err
	}
	l.cur = in
	if in.blk != nil {
		in.shards = in.blk.Shards()
		in.out, in.dx = l.b.Zeros(l.dt, l.n, l.cfg.Dim), l.b.Zeros(l.dt, l.n, l.cfg.Dim)
		return func() error {
			if err := in.blk.Forward(in.out, l.x, l.batch, l.seq); err != nil {
				return err
			}
			if err := in.blk.Backward(in.dx, l.dout); err != nil {
				return err
			}
			return l.b.Err()
		}, closeInst, nil
	}
	return func() error {
		in.m.ZeroGrad()
		if err := in.m.ForwardAsync(l.ids, l.tgts); err != nil {
			return err
		}
		if err := in.m.Backward(); err != nil {
			return err
		}
		in.step++
		if err := in.opt.Step(in.step, stepLR, 1); err != nil {
			return err
		}
		var err error
		in.loss, err = in.m.ReadLoss()
		return err
	}, closeInst, nil
}

// reset zeroes the gradients before the checked call (the step zeroes its
// own) and poisons the block's outputs.
func (l *layerCase) reset() {
	if in := l.cur; in != nil && in.blk != nil {
		in.ps.ZeroGrad()
		l.b.Fill(in.out, math.NaN())
		l.b.Fill(in.dx, math.NaN())
	}
}

func (l *layerCase) outputs() []*tensor.Tensor { return nil }

// hostOutputs are what the check compares, in float64: the block's output
// rows, input gradient rows and its parameters' gradients (those partial
// per rank summed over the group: a collective, so every rank calls it);
// the step's loss, reduced gradients and updated weights.
func (l *layerCase) hostOutputs() ([][]float64, error) {
	in := l.cur
	if in == nil {
		return nil, fmt.Errorf("ablate: %s: outputs before a site", l.op)
	}
	var grads, weights []float64
	for _, s := range in.shards {
		g, err := l.grad(s)
		if err != nil {
			return nil, err
		}
		grads = append(grads, g...)
		if in.blk == nil {
			w, err := download(l.b, s.Param.W)
			if err != nil {
				return nil, err
			}
			weights = append(weights, w...)
		}
	}
	if in.blk == nil {
		return [][]float64{{in.loss}, grads, weights}, nil
	}
	out, err := download(l.b, in.out)
	if err != nil {
		return nil, err
	}
	dx, err := download(l.b, in.dx)
	if err != nil {
		return nil, err
	}
	return [][]float64{out, dx, grads}, nil
}

// grad is a block shard's gradient, summed over the group where each rank
// holds a partial one (the step's model has reduced its own).
func (l *layerCase) grad(s shard.Shard) ([]float64, error) {
	if !s.PartialGrad || l.P == 1 || l.cur.blk == nil {
		return download(l.b, s.Param.G)
	}
	t := l.b.Zeros(s.Param.G.DType(), s.Param.G.Shape()...)
	defer l.b.Free(t)
	l.b.Copy(t, s.Param.G)
	if err := waitOn(l.st)(l.grp.AllReduce(t, comm.Sum, l.st)); err != nil {
		return nil, err
	}
	return download(l.b, t)
}

// sampled compares the collective's outputs with the unsharded reference:
// this rank's rows, and each parameter's slice.
func (l *layerCase) sampled(outs [][]float64) float64 {
	in := l.cur
	var gradRef, wRef []float64
	for _, s := range in.shards {
		full, ok := l.ref.grads[s.Param.Name]
		if !ok {
			return math.Inf(1)
		}
		gradRef = append(gradRef, rowmajor.Slice(full, s.Full, s.Dim, s.Lo, s.Hi)...)
		if in.blk == nil {
			wRef = append(wRef, rowmajor.Slice(l.ref.weights[s.Param.Name], s.Full, s.Dim, s.Lo, s.Hi)...)
		}
	}
	if in.blk == nil {
		return max(relErr(outs[0], []float64{l.ref.loss}), relErr(outs[1], gradRef), relErr(outs[2], wRef))
	}
	lo, hi := 0, l.M
	if l.sp {
		lo, hi = l.me*l.n, (l.me+1)*l.n
	}
	C := l.cfg.Dim
	return max(relErr(outs[0], l.ref.out[lo*C:hi*C]), relErr(outs[1], l.ref.dx[lo*C:hi*C]), relErr(outs[2], gradRef))
}

func (l *layerCase) verified() string {
	if l.op == OpTrainStep {
		return "loss, reduced gradients and updated weights against the unsharded layers.GPT + AdamW (same seed, inputs, backend)"
	}
	return "output, input gradient and parameter gradients against the unsharded layers.Block (same seed, inputs, backend)"
}

// siteKinds are the kinds of the layer's TP sites, which take the cell's
// strategy: the all-gather∘matmul entries and matmul∘reduce-scatter exits
// under sequence parallelism, the matmul∘all-reduce exits without it (the
// MoE block's expert path stays collective).
func (l *layerCase) siteKinds() []overlap.Kind {
	if l.sp {
		return []overlap.Kind{overlap.KindAllGatherMatmul, overlap.KindMatmulReduceScatter}
	}
	return []overlap.Kind{overlap.KindMatmulAllReduce}
}

func (l *layerCase) gemm() error { return errNoSplit }
func (l *layerCase) comm() error { return errNoSplit }

// flops per rank: the model's FLOPs per token (6·parameters + attention,
// forward and backward) over the world.
func (l *layerCase) flops() float64 {
	c := l.cfg
	if l.op != OpTrainStep {
		c.Vocab = 0
	}
	return c.FLOPsPerToken() * float64(l.M) / float64(l.P)
}

func (l *layerCase) bytes() float64     { return 0 }
func (l *layerCase) busFactor() float64 { return 0 }

// spec has no site kind: a layer cell has many sites (it is not an
// autotune key).
func (l *layerCase) spec() overlap.Spec {
	return overlap.Spec{Name: "ablate." + string(l.op), Group: l.grp, Backend: l.b, Stream: l.st, Rows: l.n, K: l.cfg.Dim,
		Outs: []int{l.cfg.FFN}, DType: l.dt}
}
