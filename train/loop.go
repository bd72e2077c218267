package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
)

// Model is what the loop needs of a model: layers.GPT has it, and so will
// a tensor-parallel model.
type Model interface {
	Params() *layers.ParamSet
	// Forward runs the model on host int32 ids and targets (B, T) and
	// returns the mean loss.
	Forward(ids, targets *tensor.Tensor) (float64, error)
	// Backward accumulates the gradients of the last Forward's loss.
	Backward() error
	ZeroGrad()
	// FLOPsPerToken is the cost of one token's forward and backward.
	FLOPsPerToken() float64
}

// AsyncLoss is an optional interface of a Model whose loss stays on the
// device (layers.GPT, parallel/model.Model): ForwardAsync is Forward
// without reading the loss back, and ReadLoss reads the loss of the last
// ForwardAsync. Run then queues Forward and Backward back to back, with no
// host sync between them, and reads the loss after Backward, or, when the
// model is a LossReader too, one step later.
type AsyncLoss interface {
	ForwardAsync(ids, targets *tensor.Tensor) error
	ReadLoss() (float64, error)
}

// MicroBatcher is an optional interface of a Model that runs a step's
// forward and backward in one call, as micro-batches whose gradients add
// up (layers.GPT, parallel/model.Model). Run sets the micro-batches from
// Config.MicroBatch before it makes the optimizer, then calls
// ForwardBackward for each step and reads the loss as from an AsyncLoss
// model (ReadLoss, LossAsync).
type MicroBatcher interface {
	// Replicas is the number of data-parallel replicas the global batch
	// is split over (1 for a model of one rank).
	Replicas() int
	// SetMicroBatches makes each ForwardBackward run its global batch as
	// k micro-batches (it may give a bf16 model fp32 main gradients,
	// which the optimizer must be made after).
	SetMicroBatches(k int) error
	// ForwardBackward runs the forward and backward of the global batch
	// (host int32 (B, T) ids and targets, as Forward takes them) and
	// leaves the gradients of the step's mean loss, reduced over the
	// ranks, and the loss for ReadLoss.
	ForwardBackward(ids, targets *tensor.Tensor) error
	ReadLoss() (float64, error)
}

// Result sums up a run.
type Result struct {
	Step         int           // the last step done (the run's global step count)
	StartStep    int           // the step the run started from (0, or the resumed checkpoint's)
	StepsRun     int           // steps done by this call
	FinalLoss    float64       // loss of the last step done
	Losses       []float64     // loss of each step done by this call, from StartStep+1
	TokensPerSec float64       // over the steps done by this call
	Elapsed      time.Duration // time spent in the steps of this call

	LastCheckpoint string // path of the newest checkpoint written or resumed from ("" if none)
}

// Option changes how Run reports and records.
type Option func(*runOptions)

type runOptions struct {
	rank0       bool
	out         io.Writer
	bar         *bool
	val         *Loader
	valEvery    int
	valBatches  int
	modelConfig any
	layout      any
	extra       func(step int) map[string]any
	lateExtra   func(step int) func() (map[string]any, error)
	hook        func(StepMetrics)
	start       func(Result) error
	watch       StepWatcher
	interrupt   bool
	tokenizer   string
	tokenizerAs []string // older names of the same kind (WithTokenizer)
	metricsDir  *string
	runConfig   any
	saveHook    func(step int)
	reshardFrom []string // a resume at another layout: the checkpoint's ranks' checkpoints (RunSharded)
	ranks       int      // the ranks of the world, recorded in each checkpoint (RunSharded)
	syncSaves   bool     // each save written before the next step (the benchmark's reference)
}

// WithRank0 says whether this process is rank 0 (the default). Only rank 0
// writes metrics, logs, the plot and checkpoints; the parallel code turns
// it off on the other ranks.
func WithRank0(isRank0 bool) Option { return func(o *runOptions) { o.rank0 = isRank0 } }

// WithMetricsDir sets where rank 0 writes metrics.jsonl and loss.png
// (default: cfg.OutDir, next to the checkpoints); "" writes neither (log
// lines still go to the output). The parallel code uses it to keep one
// metrics file for the job while each rank checkpoints its own shards.
func WithMetricsDir(dir string) Option { return func(o *runOptions) { o.metricsDir = &dir } }

// WithOutput sets where log lines and the progress bar go (default
// os.Stdout).
func WithOutput(w io.Writer) Option { return func(o *runOptions) { o.out = w } }

// WithProgressBar forces the progress bar on or off; by default it is on
// when the output is a terminal, and plain log lines every LogEvery steps
// are printed otherwise.
func WithProgressBar(on bool) Option { return func(o *runOptions) { o.bar = &on } }

// WithValidation evaluates the mean loss over the first batches batches of
// val every every steps and at the last step, reported as "val_loss".
func WithValidation(val *Loader, every, batches int) Option {
	return func(o *runOptions) { o.val, o.valEvery, o.valBatches = val, every, batches }
}

// WithModelConfig records the model's configuration in state.json (a model
// with a Config() layers.GPTConfig method is recorded without this).
func WithModelConfig(cfg any) Option { return func(o *runOptions) { o.modelConfig = cfg } }

// WithLayout records a free-form layout object in state.json (how the
// parallel code sharded the tensors).
func WithLayout(layout any) Option { return func(o *runOptions) { o.layout = layout } }

// WithExtraMetrics adds fields to each step's metrics (aux loss, ...).
func WithExtraMetrics(fn func(step int) map[string]any) Option {
	return func(o *runOptions) { o.extra = fn }
}

// WithLateExtraMetrics adds fields to each step's metrics that are read
// one step late, with the step's loss: fn(step) is called right after the
// step's forward and backward (like WithExtraMetrics' function, before the
// next forward replaces what it reads) and must not wait for the device;
// the function it returns is called when the step is read back, after the
// next step is queued, and gives the fields (an MoE model's aux loss and
// router statistics, whose read it waits for then). Its error stops the
// run.
func WithLateExtraMetrics(fn func(step int) func() (map[string]any, error)) Option {
	return func(o *runOptions) { o.lateExtra = fn }
}

// WithStepHook calls fn after every step, on every rank, when the step is
// read back: Run keeps one step queued ahead (see the package comment), so
// fn of step s runs after step s+1 is queued, and a ctx cancelled from fn
// stops the run after step s+1 (on every rank alike).
func WithStepHook(fn func(StepMetrics)) Option { return func(o *runOptions) { o.hook = fn } }

// StepWatcher is told where each training step begins and ends, on every
// rank (shadow mode's sampling: overlap.Shadow is one).
type StepWatcher interface {
	// BeginStep is called before the step's forward.
	BeginStep(step int)
	// EndStep is called right after the step's backward, before its update
	// (a collective when the watcher makes one: every rank calls it after
	// every step). Its fields join the step's metrics. An error stops the
	// run after the step: the update is applied, the step recorded and
	// checkpointed, and Run returns an error wrapping it.
	EndStep(step int) (map[string]any, error)
}

// WithStepWatcher has w watch every training step (StepWatcher); the
// forward passes of a validation are not steps.
func WithStepWatcher(w StepWatcher) Option { return func(o *runOptions) { o.watch = w } }

// WithStartHook calls fn once the run is ready to take its first step: the
// checkpoint of a resume is loaded and checked, nothing is written yet. An
// error from fn stops the run before any step. cmd/train writes its
// config.json there, so a resume that fails leaves it as it was.
func WithStartHook(fn func(Result) error) Option { return func(o *runOptions) { o.start = fn } }

// WithInterruptibleSteps lets a cancelled ctx stop a step in the middle of
// its forward or backward pass, when the backend can stop between (and
// inside) its ops (tensor.Interruptible, the CPU backend): the half-done
// step is dropped, and the state after the step before it (the parameters
// and moments are untouched until the optimizer update) is checkpointed
// with the data position it had. Without it, or on a backend that cannot
// stop, a cancelled ctx stops the run after the current step. Only for a
// model of one rank: a rank of a parallel model that stopped mid-step
// would leave its peers waiting in a collective.
func WithInterruptibleSteps() Option { return func(o *runOptions) { o.interrupt = true } }

// WithRunConfig records the configuration of the program that runs the
// training in every checkpoint's state.json (State.RunConfig), as JSON:
// what the program reads back on a resume to keep the run's settings
// beyond Config (cmd/train records its whole configuration).
func WithRunConfig(cfg any) Option { return func(o *runOptions) { o.runConfig = cfg } }

// WithSaveHook calls fn in the background writer of every checkpoint once
// its files are written and fsynced, before its directory is renamed into
// place: where a crash in the middle of a save strikes. For fault-injection
// tests (cmd/train's ASYNCTP_FAULT_EXIT_AT_STEP with ":save" kills the
// process there); fn runs on the writer's goroutine.
func WithSaveHook(fn func(step int)) Option { return func(o *runOptions) { o.saveHook = fn } }

// WithTokenizer records what the token ids mean in state.json ("bytes",
// "token ids", or a hash of a tokenizer file): a resume compares it. older
// are names that earlier checkpoints gave the same kind; a resume accepts
// them too.
func WithTokenizer(id string, older ...string) Option {
	return func(o *runOptions) { o.tokenizer, o.tokenizerAs = id, older }
}

// Run trains model on data for cfg.Steps steps (counted from 0, or from the
// checkpoint named by cfg.Resume). Each step: ZeroGrad, Forward, Backward,
// the gradient norm, AdamW with clipping, metrics. It writes a checkpoint
// every cfg.CheckpointEvery steps and at the end.
//
// A non-finite loss or gradient norm stops the run with an error naming the
// step and the last good checkpoint; the bad state is not saved (with the
// reads one step late, the step after it may have been queued, never
// checkpointed). When ctx is
// cancelled the run stops after the current step, writes a checkpoint and
// returns an error wrapping ctx's cause (errors.Is(err, context.Canceled)).
// The Result is filled in every case.
func Run(ctx context.Context, b tensor.Backend, model Model, data *Loader, cfg Config, opts ...Option) (Result, error) {
	o := runOptions{rank0: true, out: os.Stdout}
	for _, opt := range opts {
		opt(&o)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if b == nil || model == nil || data == nil {
		return Result{}, errors.New("train: Run needs a backend, a model and a data loader")
	}
	if dc := data.Config(); dc.Batch != cfg.Batch || dc.Seq != cfg.Seq || dc.Seed != cfg.Seed {
		return Result{}, fmt.Errorf("train: the loader of %s yields batch %d, seq %d with seed %d; the config says batch %d, seq %d, seed %d",
			data.Name(), dc.Batch, dc.Seq, dc.Seed, cfg.Batch, cfg.Seq, cfg.Seed)
	}
	if o.val != nil && (o.valEvery <= 0 || o.valBatches <= 0) {
		return Result{}, fmt.Errorf("train: validation every %d steps over %d batches, want both > 0", o.valEvery, o.valBatches)
	}
	if err := setMicroBatches(model, cfg); err != nil {
		return Result{}, err
	}
	if err := setRecompute(model, cfg); err != nil {
		return Result{}, err
	}
	ps := model.Params()
	if ps == nil {
		return Result{}, errors.New("train: the model has no parameter set")
	}
	opt, err := newOptimizer(b, model, cfg)
	if err != nil {
		return Result{}, err
	}
	modelCfg, err := modelConfigJSON(model, o.modelConfig)
	if err != nil {
		return Result{}, err
	}
	var layout json.RawMessage
	if o.layout != nil {
		if layout, err = json.Marshal(o.layout); err != nil {
			return Result{}, fmt.Errorf("train: layout: %w", err)
		}
	}

	var runCfg json.RawMessage
	if o.runConfig != nil {
		if runCfg, err = json.Marshal(o.runConfig); err != nil {
			return Result{}, fmt.Errorf("train: run config: %w", err)
		}
	}
	shards := shardsOf(model)
	r := &runner{ctx: ctx, b: b, model: model, data: data, cfg: cfg, o: o, opt: opt, modelCfg: modelCfg, layout: layout, runCfg: runCfg,
		sched: optim.Replanned{WarmupCosine: cfg.Schedule()}, slices: slicesOf(shards)}
	if cfg.Resume != "" {
		var dir string
		var st *State
		cks := o.reshardFrom
		if cks == nil && isRunOfRanks(cfg.Resume) { // a model of one rank from a run of several
			if cks, err = RunCheckpoints(cfg.Resume); err != nil {
				return Result{}, err
			}
		}
		if cks != nil {
			dir, r.o.reshardFrom = cks[0], cks
			if st, err = loadResharded(cks, b, opt, shards); err != nil {
				return Result{}, err
			}
		} else {
			if dir, err = ResolveCheckpoint(cfg.Resume); err != nil {
				return Result{}, err
			}
			if st, err = LoadCheckpoint(dir, b, opt); err != nil {
				return Result{}, err
			}
		}
		if err := data.Seek(st.Data); err != nil {
			return Result{}, fmt.Errorf("train: resume from %s: %w", dir, err)
		}
		if o.tokenizer != "" && st.Tokenizer != "" && st.Tokenizer != o.tokenizer && !slices.Contains(o.tokenizerAs, st.Tokenizer) {
			return Result{}, fmt.Errorf("train: resume from %s: the checkpoint's token ids are %s, this run's data are %s", dir, st.Tokenizer, o.tokenizer)
		}
		if st.Step > cfg.Steps {
			return Result{}, fmt.Errorf("train: resume from %s: the checkpoint is at step %d, past the run's %d steps", dir, st.Step, cfg.Steps)
		}
		r.sched.Replans = Replans(st, cfg.Steps)
		r.res.StartStep, r.res.Step, r.res.FinalLoss = st.Step, st.Step, st.Loss
		r.res.LastCheckpoint, r.savedStep, r.elapsedBase = dir, st.Step, st.ElapsedS
	}
	return r.run()
}

// OptimizerSharder is an optional interface of a Model whose optimizer
// state is sharded over its data-parallel group (a distributed optimizer,
// parallel/model.Model with Options.DistributedOptimizer): Run makes its
// AdamW with optim.NewShardedAdamW over the sharding it gives (ok false:
// a whole optimizer), and its checkpoints hold each rank's runs.
type OptimizerSharder interface {
	OptimizerSharding() (sh optim.Sharding, ok bool)
}

// newOptimizer is the run's AdamW: a distributed optimizer's rank for a
// model that shards it (OptimizerSharder), else the whole one.
func newOptimizer(b tensor.Backend, model Model, cfg Config) (*optim.AdamW, error) {
	if s, ok := model.(OptimizerSharder); ok {
		if sh, ok := s.OptimizerSharding(); ok {
			return optim.NewShardedAdamW(b, model.Params(), cfg.AdamW(), sh)
		}
	}
	return optim.NewAdamWWithConfig(b, model.Params(), cfg.AdamW())
}

// Replans is the schedule's history of a run of steps steps resumed from
// the checkpoint whose state is st: the checkpoint's, and, when steps
// differs from the length the checkpoint's run planned
// (st.TrainConfig.Steps), a replan at the checkpoint's step. The rule of
// optim.Replanned follows: what was left of the decay at the resumed step
// spreads over the steps up to the new length, so the learning rate goes
// on from where it was; a run resumed to its planned length keeps its
// schedule as it was.
func Replans(st *State, steps int) []optim.Replan {
	out := slices.Clone(st.Replans)
	if old := st.TrainConfig.Steps; old > 0 && steps != old {
		out = append(out, optim.Replan{At: st.Step, Steps: old})
	}
	return out
}

// describeReplan says what the last replan of s does, in a line.
func describeReplan(s optim.Replanned) string {
	r := s.Replans[len(s.Replans)-1]
	lr := s.LR(r.At)
	switch {
	case r.At < s.Warmup:
		return fmt.Sprintf("the run's length changes from %d to %d steps at step %d, in the warm-up: the warm-up ends at step %d as planned, then the decay runs to min_lr %.3g at step %d",
			r.Steps, s.Steps, r.At, s.Warmup, s.Min, s.Steps)
	case r.At >= r.Steps && r.Steps > s.Warmup:
		return fmt.Sprintf("the run's length changes from %d to %d steps at step %d, after its decay ended: the learning rate stays at min_lr %.3g", r.Steps, s.Steps, r.At, lr)
	}
	return fmt.Sprintf("the run's length changes from %d to %d steps at step %d: the rest of the decay, from lr %.3g now, spreads over steps %d to %d down to min_lr %.3g",
		r.Steps, s.Steps, r.At, lr, r.At+1, s.Steps, s.Min)
}

// modelConfigJSON is the model's configuration for state.json.
func modelConfigJSON(m Model, explicit any) (json.RawMessage, error) {
	v := explicit
	if v == nil {
		if c, ok := m.(interface{ Config() layers.GPTConfig }); ok {
			v = c.Config()
		}
	}
	if v == nil {
		return nil, nil
	}
	js, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("train: model config: %w", err)
	}
	return js, nil
}

// setMicroBatches gives a MicroBatcher its micro-batches per step from
// cfg.MicroBatch; a model that is not one takes none.
func setMicroBatches(model Model, cfg Config) error {
	mb, ok := model.(MicroBatcher)
	if !ok {
		if cfg.MicroBatch != 0 && cfg.MicroBatch != cfg.Batch {
			return fmt.Errorf("train: micro_batch %d: the model (%T) cannot run a step as micro-batches, expected 0 or the batch %d", cfg.MicroBatch, model, cfg.Batch)
		}
		return nil
	}
	k, err := cfg.MicroBatches(mb.Replicas())
	if err != nil {
		return err
	}
	return mb.SetMicroBatches(k)
}

// Recomputer is an optional interface of a Model whose forward can keep
// fewer activations, the backward recomputing the rest (layers.GPT,
// parallel/model.Model): Run sets Config.Recompute through it.
type Recomputer interface {
	SetRecompute(r layers.Recompute) error
}

// setRecompute gives a Recomputer cfg.Recompute; a model that is not one
// takes none.
func setRecompute(model Model, cfg Config) error {
	if cfg.Recompute == "" {
		return nil
	}
	r, err := layers.ParseRecompute(cfg.Recompute)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	rc, ok := model.(Recomputer)
	if !ok {
		if r != layers.RecomputeNone {
			return fmt.Errorf("train: recompute %s: the model (%T) cannot recompute activations, expected none", r, model)
		}
		return nil
	}
	return rc.SetRecompute(r)
}
