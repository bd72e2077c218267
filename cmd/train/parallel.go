package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
	"github.com/asynctp/asynctp/hf"
	"github.com/asynctp/asynctp/launch"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
	"github.com/asynctp/asynctp/train/routing"
)

// newRankBackend is the backend of one rank of a parallel run (tests swap
// it to inject faults).
var newRankBackend = func(rank, threads int) tensor.Backend { return cpu.New(cpu.WithThreads(threads)) }

// runParallel trains at the layout cfg.Parallel: World = DP × TP ranks as
// goroutines over one comm/local world, each with its own CPU backend,
// comm.Grid, parallel/model.Model and train.RunSharded. World rank 0 prints and
// writes metrics.jsonl and loss.png in the out dir; every rank writes its
// own shards' checkpoints under OUT/rank-NNNNN (train.RunSharded).
func runParallel(ctx context.Context, cfg Config) error {
	p := cfg.Parallel
	W := p.World
	threads := max(1, runtime.GOMAXPROCS(0)/W)
	note := ""
	if cfg.Device == "auto" {
		note = "; auto: parallel layouts run on the CPU"
	}
	fmt.Printf("device: cpu, %d ranks as goroutines (%d threads each%s)\n", W, threads, note)
	fmt.Printf("parallel: %s, comm timeout %v\n", p, time.Duration(p.CommTimeout))

	ds, err := openDataset(cfg)
	if err != nil {
		return err
	}
	lc := loaderConfig(cfg)
	probe, err := train.NewLoader(ds, lc) // the data's errors before any rank starts
	if err != nil {
		return err
	}
	mc := cfg.Model.WithDefaults()
	fmt.Println(modelLine(cfg.Preset, mc, paramCount(mc)))
	fmt.Printf("data: %s, %d tokens; batch %d x %d, %d steps\n", probe.Name(), probe.Tokens(), cfg.Train.Batch, cfg.Train.Seq, cfg.Train.Steps)
	printResume(cfg)

	o, err := worldOptions(cfg)
	if err != nil {
		return err
	}
	var res train.Result
	err = launch.Goroutines(W, o, func(w *launch.World) error {
		r, err := trainRank(ctx, w, cfg, ds, faults{})
		if w.Info.Rank == 0 {
			res = r
		}
		return err
	})
	if err != nil {
		return err
	}
	fmt.Printf("done: step %d, loss %.4f, %.0f tokens/s; checkpoints %s\n", res.Step, res.FinalLoss, res.TokensPerSec,
		filepath.Join(cfg.Train.OutDir, "rank-*", filepath.Base(res.LastCheckpoint)))
	return nil
}

// trainRank trains the rank of w: its part of the model on its backend in
// its dtype, over its grid, and train.RunSharded, with the interrupt
// agreement after every step (and the test hooks of fault, when set). Every
// collective of the model and of the agreement is ordered on w.Stream
// (nil on the CPU).
func trainRank(ctx context.Context, w *launch.World, cfg Config, ds *tokens.Stream, fault faults) (_ train.Result, err error) {
	p := cfg.Parallel
	c, g, b, s, dt := w.Comm, w.Grid, w.Backend, w.Stream, w.DType
	if g == nil {
		return train.Result{}, fmt.Errorf("rank %d: a world without a grid, expected dp %d × tp %d, ep %d", c.Rank(), p.DP, p.TP, p.EP)
	}
	tune, err := tuning(cfg, b, dt, c)
	if err != nil {
		return train.Result{}, err
	}
	var sh *overlap.Shadow
	if cfg.Shadow != nil {
		if sh, err = overlap.NewShadow(*cfg.Shadow, g.World, b, s, dt); err != nil {
			return train.Result{}, err
		}
	}
	ch, err := newChooser(cfg, tune, sh, w.Transport, rankStrategies(cfg, c, b))
	if err != nil {
		return train.Result{}, err
	}
	gr, err := cfg.gradReduce(dt)
	if err != nil {
		return train.Result{}, err
	}
	m, err := model.New(b, g, cfg.Model, model.Options{SequenceParallel: p.SequenceParallel, Stream: s, Overlap: ch,
		MaxTokens: moeMaxTokens(cfg), GradReduce: gr, DistributedOptimizer: p.DistributedOptimizer}, dt)
	if err != nil {
		return train.Result{}, err
	}
	defer func() { // the gradient reduction's side streams, once the loop has ended
		if cerr := m.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("rank %d: %w", c.Rank(), cerr))
		}
	}()
	if err := saveAutotune(tune, c.Rank() == 0); err != nil {
		return train.Result{}, err
	}
	if err := ch.CheckUsed(); err != nil {
		return train.Result{}, err
	}
	if sh != nil {
		if err := sh.CheckUsed(); err != nil {
			return train.Result{}, err
		}
	}
	if c.Rank() == 0 {
		printOverlap(ch)
		printShadow(sh)
		if m.Config().Experts > 0 {
			fmt.Println("moe: expert GEMMs", expertGEMMLine(cfg.GroupedGEMM, b.Name(), shardedGEMMs(m)))
		}
	}
	l := m.Layout()
	if err := initWeights(cfg, b, m.Params(), hf.Placement{TP: l.TP, TPRank: l.TPRank, EP: l.EP, EPRank: l.Rank % l.EP}); err != nil {
		return train.Result{}, err
	}
	data, more, err := dataAndOptions(cfg, ds, c.Rank() == 0)
	if err != nil {
		return train.Result{}, err
	}
	stop := newStopAgreement(ctx, g.World, b, s)
	defer stop.close()
	opts := []train.Option{train.WithStepHook(stop.hook)}
	if hook := fault.step; hook != nil {
		opts[0] = train.WithStepHook(func(m train.StepMetrics) { hook(m); stop.hook(m) })
	}
	if fault.save != nil {
		opts = append(opts, train.WithSaveHook(fault.save))
	}
	opts = append(opts, more...)
	dump, err := openRoutingDump(cfg, c.Rank(), b, routing.ModelLayers(m))
	if err != nil {
		return train.Result{}, err
	}
	if m.Config().Experts > 0 {
		opts = append(opts, train.WithLateExtraMetrics(dump.Then(func(int) func() (map[string]any, error) { return routerMetrics(m) })))
	}
	if sh != nil {
		opts = append(opts, train.WithStepWatcher(sh))
	}
	res, err := train.RunSharded(stop.ctx, b, m, data, cfg.Train, opts...)
	if sh != nil && c.Rank() == 0 {
		for _, line := range sh.Summary() {
			fmt.Println(line)
		}
	}
	return res, errors.Join(err, dump.Close())
}

// rankStrategies gives a rank its strategies, one per name (the run's,
// overlapStrategies: each picks its form per site from the group and
// backend); tests put a deliberately wrong strategy in their place.
var rankStrategies = func(cfg Config, _ comm.Comm, _ tensor.Backend) []overlap.Strategy {
	s, _ := overlapStrategies(cfg)
	return s
}

// stopAgreement makes the ranks stop at the same step when the run is
// interrupted: after every step each rank all-reduces (max) whether its
// context is done, and all of them cancel their run's context together, so
// every rank checkpoints the same step and none waits for the others. The
// flag goes through the model's backend (a GPU transport moves device
// memory only), reduced on the backend's stream s (hostreduce.AllReduce).
type stopAgreement struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelCauseFunc
	world  comm.Comm
	b      tensor.Backend
	s      comm.Stream
}

func newStopAgreement(parent context.Context, world comm.Comm, b tensor.Backend, s comm.Stream) *stopAgreement {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &stopAgreement{parent: parent, ctx: ctx, cancel: cancel, world: world, b: b, s: s}
}

// close cancels the run's context.
func (s *stopAgreement) close() { s.cancel(nil) }

func (s *stopAgreement) hook(train.StepMetrics) {
	if s.ctx.Err() != nil {
		return
	}
	flag := []float64{0}
	if s.parent.Err() != nil {
		flag[0] = 1
	}
	if err := hostreduce.AllReduce(s.b, s.world, tensor.Float32, flag, comm.Max, s.s); err != nil {
		return // the world or the backend is broken: the next step fails and says why
	}
	if flag[0] > 0 {
		cause := context.Cause(s.parent)
		if cause == nil {
			cause = fmt.Errorf("another rank was interrupted: %w", context.Canceled)
		}
		s.cancel(cause)
	}
}

// paramCount is the number of parameters of the whole model of cfg
// (defaults filled in), as layers.GPT counts them.
func paramCount(c layers.GPTConfig) int {
	n := c.Vocab*c.Dim + c.Dim // embedding, final norm
	if !c.TiedEmbeddings {
		n += c.Vocab * c.Dim
	}
	for l := range c.Layers {
		n += 2*c.Dim + c.AttentionParams() // norms, attention
		if c.IsMoE(l) {
			n += c.Experts*c.Dim + c.Experts*3*c.Dim*c.FFN
		} else {
			n += 3 * c.Dim * c.FFN
		}
	}
	return n
}
