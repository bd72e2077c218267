package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/asynctp/asynctp/tensor"
)

// runner is the state of one Run.
type runner struct {
	ctx      context.Context
	b        tensor.Backend
	model    Model
	data     *Loader
	cfg      Config
	o        runOptions
	opt      *AdamW
	modelCfg json.RawMessage
	layout   json.RawMessage
	sink     *metricsSink

	res         Result
	savedStep   int           // step of res.LastCheckpoint
	elapsedBase float64       // wall seconds of the runs before this one (from the checkpoint)
	start       time.Time     // when this run started
	trainTime   time.Duration // time spent in steps by this run
}

// elapsed is the wall time of the whole training so far, over resumes.
func (r *runner) elapsed() float64 { return r.elapsedBase + time.Since(r.start).Seconds() }

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func (r *runner) run() (Result, error) {
	cfg := r.cfg
	if r.res.StartStep == cfg.Steps {
		return r.res, nil // a finished run: nothing to do
	}
	if err := r.ctx.Err(); err != nil {
		return r.res, fmt.Errorf("train: not started: %w", context.Cause(r.ctx))
	}
	if r.o.rank0 {
		if err := CleanStale(cfg.OutDir); err != nil {
			return r.res, err
		}
	}
	if r.o.start != nil {
		if err := r.o.start(r.res); err != nil {
			return r.res, err
		}
	}
	if r.o.rank0 {
		bar := isTerminal(r.o.out)
		if r.o.bar != nil {
			bar = *r.o.bar
		}
		var err error
		dir := cfg.OutDir
		if r.o.metricsDir != nil {
			dir = *r.o.metricsDir
		}
		if r.sink, err = newMetricsSink(dir, r.res.StartStep, cfg.Steps, cfg.LogEvery, r.o.out, bar); err != nil {
			return r.res, err
		}
		defer r.sink.close()
		if r.res.StartStep > 0 {
			r.sink.logf("resumed from %s at step %d", r.res.LastCheckpoint, r.res.StartStep)
		}
	}
	tokens := float64(cfg.Batch * cfg.Seq)
	r.start = time.Now()
	for step := r.res.StartStep + 1; step <= cfg.Steps; step++ {
		pos := r.data.Position()
		m, err := r.step(step)
		if err != nil {
			if errors.Is(err, tensor.ErrInterrupted) && r.ctx.Err() != nil {
				return r.res, r.interrupted(step, pos, err)
			}
			return r.res, err
		}
		r.res.Step, r.res.StepsRun, r.res.FinalLoss = step, r.res.StepsRun+1, m.Loss
		r.res.Losses = append(r.res.Losses, m.Loss)
		r.res.Elapsed = r.trainTime
		if s := r.trainTime.Seconds(); s > 0 {
			r.res.TokensPerSec = tokens * float64(r.res.StepsRun) / s
		}
		if r.sink != nil {
			if err := r.sink.record(m); err != nil {
				return r.res, err
			}
		}
		if r.o.hook != nil {
			r.o.hook(m)
		}
		last := step == cfg.Steps
		stop := r.ctx.Err() != nil && !last
		if last || stop || (cfg.CheckpointEvery > 0 && step%cfg.CheckpointEvery == 0) {
			if err := r.save(step, m.Loss); err != nil {
				return r.res, err
			}
		}
		if stop {
			return r.res, fmt.Errorf("train: stopped after step %d (checkpoint %s): %w", step, orNone(r.res.LastCheckpoint), context.Cause(r.ctx))
		}
	}
	return r.res, nil
}

// step runs one training step and returns its metrics.
func (r *runner) step(step int) (StepMetrics, error) {
	b, cfg := r.b, r.cfg
	t0 := time.Now()
	ids, targets, err := r.data.Next()
	if err != nil {
		return StepMetrics{}, fmt.Errorf("train: step %d: data: %w", step, err)
	}
	stoppable, _ := b.(tensor.Interruptible)
	if !r.o.interrupt {
		stoppable = nil
	}
	if stoppable != nil {
		stoppable.SetInterrupt(func() bool { return r.ctx.Err() != nil })
	}
	r.model.ZeroGrad()
	loss, err := r.forwardBackward(ids, targets, step)
	if stoppable != nil {
		stoppable.SetInterrupt(nil) // the update below runs whole or not at all
	}
	if err != nil {
		return StepMetrics{}, err
	}
	norm, err := r.gradNorm()
	if err != nil {
		return StepMetrics{}, fmt.Errorf("train: step %d: %w", step, err)
	}
	if !finite(norm) {
		return StepMetrics{}, r.diverged("gradient norm", norm, step)
	}
	lr := LearningRate(step, cfg)
	if err := r.opt.Step(step, lr, ClipScale(norm, cfg.GradClip)); err != nil {
		return StepMetrics{}, err
	}
	if err := b.Sync(); err != nil {
		return StepMetrics{}, fmt.Errorf("train: step %d: %w", step, err)
	}
	dt := time.Since(t0)
	r.trainTime += dt
	tps := float64(cfg.Batch*cfg.Seq) / dt.Seconds()
	m := StepMetrics{
		Step: step, Loss: loss, LR: lr, GradNorm: norm, TokensPerSec: tps,
		ElapsedS: r.elapsed(),
		Extra:    map[string]any{},
	}
	if f := r.model.FLOPsPerToken(); f > 0 {
		m.Extra["flops_per_s"] = f * tps
	}
	if r.o.extra != nil { // before the validation, whose forward passes replace the router's statistics
		for k, v := range r.o.extra(step) {
			m.Extra[k] = v
		}
	}
	if r.o.val != nil && (step%r.o.valEvery == 0 || step == cfg.Steps) {
		vl, err := r.validate()
		if err != nil {
			return StepMetrics{}, fmt.Errorf("train: step %d: validation: %w", step, err)
		}
		m.Extra["val_loss"] = vl
		m.Extra["val_ppl"] = math.Exp(vl)
	}
	return m, nil
}

// forwardBackward runs the step's forward and backward and returns its
// loss. A model with AsyncLoss reads the loss after the backward, so the
// two are queued back to back; a non-finite loss stops the step either
// way before the gradient norm and the update.
func (r *runner) forwardBackward(ids, targets *tensor.Tensor, step int) (float64, error) {
	async, ok := r.model.(AsyncLoss)
	var loss float64
	var err error
	if ok {
		err = async.ForwardAsync(ids, targets)
	} else {
		loss, err = r.model.Forward(ids, targets)
	}
	if err != nil {
		return 0, fmt.Errorf("train: step %d: forward: %w", step, err)
	}
	if !ok && !finite(loss) {
		return 0, r.diverged("loss", loss, step)
	}
	if err := r.model.Backward(); err != nil {
		return 0, fmt.Errorf("train: step %d: backward: %w", step, err)
	}
	if err := r.b.Err(); err != nil {
		return 0, fmt.Errorf("train: step %d: %w", step, err)
	}
	if ok {
		if loss, err = async.ReadLoss(); err != nil {
			return 0, fmt.Errorf("train: step %d: reading the loss: %w", step, err)
		}
		if !finite(loss) {
			return 0, r.diverged("loss", loss, step)
		}
	}
	return loss, nil
}

// GradSumSquarer is an optional interface of a Model whose parameters are
// sharded over ranks (tensor parallelism): GradSumSquares returns Σ g² over
// the whole model's gradients, each parameter counted once, the same on
// every rank. Run takes the gradient norm for clipping from it instead of
// from the local flat gradient.
type GradSumSquarer interface {
	GradSumSquares() (float64, error)
}

// gradNorm is the global gradient norm of the step.
func (r *runner) gradNorm() (float64, error) {
	g, ok := r.model.(GradSumSquarer)
	if !ok {
		return r.opt.GradNorm()
	}
	ss, err := g.GradSumSquares()
	if err != nil {
		return 0, fmt.Errorf("train: gradient norm: %w", err)
	}
	return math.Sqrt(ss), nil
}

// validate is the mean cross-entropy over the first valBatches batches of
// the validation loader (always the same batches); an MoE model's
// auxiliary losses (AuxLoss) are not part of it.
func (r *runner) validate() (float64, error) {
	r.o.val.Reset()
	var sum float64
	aux, _ := r.model.(interface{ AuxLoss() float64 })
	for range r.o.valBatches {
		ids, targets, err := r.o.val.Next()
		if err != nil {
			return 0, err
		}
		l, err := r.model.Forward(ids, targets)
		if err != nil {
			return 0, err
		}
		if aux != nil {
			l -= aux.AuxLoss()
		}
		sum += l
	}
	return sum / float64(r.o.valBatches), nil
}

// interrupted ends a run whose step was stopped in the middle by a
// cancelled ctx (WithInterruptibleSteps): the backend is cleared, the data
// goes back to where the step began, and the state after the step before,
// which the half-done step has not changed, is checkpointed (unless it is
// step 0, or already saved).
func (r *runner) interrupted(step int, pos DataPosition, cause error) error {
	if s, ok := r.b.(tensor.Interruptible); ok {
		s.ClearInterrupt()
	}
	if err := r.b.Err(); err != nil {
		return fmt.Errorf("train: interrupted in step %d, and the backend still holds an error (%v); last checkpoint %s: %w", step, err, orNone(r.res.LastCheckpoint), cause)
	}
	if err := r.data.Seek(pos); err != nil {
		return fmt.Errorf("train: interrupted in step %d: %w", step, err)
	}
	if step-1 > 0 {
		if err := r.save(step-1, r.res.FinalLoss); err != nil {
			return err
		}
	}
	return fmt.Errorf("train: stopped in step %d, which is dropped (checkpoint %s): %w", step, orNone(r.res.LastCheckpoint), context.Cause(r.ctx))
}

func (r *runner) diverged(what string, v float64, step int) error {
	return fmt.Errorf("train: %s is %v at step %d; last good checkpoint: %s", what, v, step, orNone(r.res.LastCheckpoint))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// save writes the checkpoint after step (rank 0 only), prunes old ones and
// redraws the loss plot.
func (r *runner) save(step int, loss float64) error {
	if !r.o.rank0 || step == r.savedStep && r.res.LastCheckpoint != "" {
		return nil
	}
	st := State{
		Step:        step,
		Data:        r.data.Position(),
		Loss:        loss,
		ElapsedS:    r.elapsed(),
		ModelConfig: r.modelCfg,
		TrainConfig: r.cfg,
		Layout:      r.layout,
		Tokenizer:   r.o.tokenizer,
	}
	dir, err := SaveCheckpoint(r.cfg.OutDir, r.b, r.opt, st)
	if err != nil {
		return err
	}
	r.res.LastCheckpoint, r.savedStep = dir, step
	if err := PruneCheckpoints(r.cfg.OutDir, r.cfg.KeepCheckpoints); err != nil {
		return err
	}
	r.sink.logf("checkpoint %s", dir)
	return r.sink.plot()
}
