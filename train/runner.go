package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/shard"
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
	opt      *optim.AdamW
	modelCfg json.RawMessage
	runCfg   json.RawMessage
	layout   json.RawMessage
	sink     *metricsSink
	sched    optim.Replanned        // the learning rate of each step
	slices   map[string]shard.Slice // the model's split parameters' slices, recorded in its checkpoints

	res         Result
	savedStep   int           // step of res.LastCheckpoint
	elapsedBase float64       // wall seconds of the runs before this one (from the checkpoint)
	start       time.Time     // when this run started
	trainTime   time.Duration // time spent in steps by this run

	pend     *pendingStep         // the step queued but not read back yet
	saving   chan savedCheckpoint // the checkpoint being written in the background, or nil
	snap     *Snapshot            // the host tensors of the last checkpoint written, to fill again
	lastDone time.Time            // when the last step was read back (or the run, a checkpoint, a validation ended)
	// hostSteps: the backend has no asynchronous reads (tensor.AsyncReader:
	// the CPU), so a step's work is done when queue returns, and a step's
	// time is queue's own. (Timed from read-back to read-back instead, with
	// steps queued one ahead, each step got the next one's compute, and the
	// step read back at once for a validation or checkpoint got ~0: 6.5 M
	// tokens/s printed at every validation of README's first command.)
	hostSteps bool
}

// elapsed is the wall time of the whole training so far, over resumes.
func (r *runner) elapsed() float64 { return r.elapsedBase + time.Since(r.start).Seconds() }

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// run runs the loop, then waits for the checkpoint being written (every
// way the loop ends: a save in flight is always finished, so a stopped or
// failed run leaves it complete).
func (r *runner) run() (Result, error) {
	_, err := r.loop()
	if werr := r.waitSave(); werr != nil {
		err = errors.Join(err, werr)
	}
	return r.res, err
}

func (r *runner) loop() (Result, error) {
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
			if n := len(r.o.reshardFrom); n > 0 {
				r.sink.logf("resumed from %s and the checkpoints of its run's other %d ranks, resharded, at step %d", r.res.LastCheckpoint, n-1, r.res.StartStep)
			} else {
				r.sink.logf("resumed from %s at step %d", r.res.LastCheckpoint, r.res.StartStep)
			}
			if n := len(r.sched.Replans); n > 0 && r.sched.Replans[n-1].At == r.res.StartStep {
				r.sink.logf("schedule: %s", describeReplan(r.sched))
			}
		}
	}
	r.start = time.Now()
	r.lastDone = r.start
	_, async := r.b.(tensor.AsyncReader)
	r.hostSteps = !async
	for step := r.res.StartStep + 1; step <= cfg.Steps; step++ {
		pos := r.data.Position()
		p, err := r.queue(step)
		if p != nil {
			p.issued = time.Now()
		}
		var watched error // the watcher stops the run after this step
		if errors.As(err, new(*watcherStop)) {
			watched, err = err, nil
		}
		if err != nil {
			if errors.Is(err, tensor.ErrInterrupted) && r.ctx.Err() != nil {
				return r.res, r.interrupted(step, pos, err)
			}
			if r.pend != nil { // record the step before, whose work is done, when it reads back
				_ = r.flush()
			}
			return r.res, err
		}
		// The step before is read back only now, with this one queued
		// behind it: its loss and norm copies landed while the host
		// queued this step, so the device never waits for the host.
		if err := r.flush(); err != nil {
			return r.res, err
		}
		r.pend = p
		if err := r.pollSave(); err != nil {
			return r.res, err
		}
		last := step == cfg.Steps
		stop := r.ctx.Err() != nil && !last || watched != nil
		save := last || stop || (cfg.CheckpointEvery > 0 && step%cfg.CheckpointEvery == 0)
		val := r.o.val != nil && (step%r.o.valEvery == 0 || last)
		if !save && !val {
			continue
		}
		// A checkpoint or a validation needs the weights after this step:
		// read it back now, before the next step's update is queued.
		if err := r.flush(); err != nil {
			return r.res, err
		}
		if save {
			if err := r.save(step, r.res.FinalLoss); err != nil {
				return r.res, err
			}
			r.lastDone = time.Now() // the next step's time leaves the checkpoint out
		}
		if stop {
			if err := r.waitSave(); err != nil {
				return r.res, err
			}
		}
		if watched != nil {
			return r.res, fmt.Errorf("train: stopped after step %d (checkpoint %s): %w", step, orNone(r.res.LastCheckpoint), errors.Unwrap(watched))
		}
		if stop {
			return r.res, fmt.Errorf("train: stopped after step %d (checkpoint %s): %w", step, orNone(r.res.LastCheckpoint), context.Cause(r.ctx))
		}
	}
	if w, ok := r.model.(interface{ WaitParams() error }); ok {
		// A distributed optimizer's last all-gather: the model's weights
		// are whole when Run returns.
		if err := w.WaitParams(); err != nil {
			return r.res, err
		}
	}
	return r.res, r.waitSave() // the last checkpoint, before the progress bar ends
}

// pendingStep is a step whose work is queued and whose loss and gradient
// norm may still be on the device.
type pendingStep struct {
	step   int
	lr     float64
	queued time.Time               // when the step began
	issued time.Time               // when queue returned (a host backend's step is done then)
	loss   func() (float64, error) // waits for the loss read-back
	normSq tensor.HostRead         // Σ g², nil when norm is known
	norm   float64
	extra  map[string]any                 // o.extra's fields, taken right after the step's forward
	late   func() (map[string]any, error) // o.lateExtra's, read with the loss
}

// queue runs one training step up to the update without reading anything
// back to the host where the model and the backend allow it: the forward
// and backward (ForwardAsync), then the optimizer's ClipStep: Σ g² into a
// device scalar (the model's, an optim.DeviceGradSumSquarer, or the flat
// gradient's) and AdamW clipping by that scalar on the device (which skips
// the update when the norm is not finite, so a NaN never reaches the
// weights).
// The loss and Σ g² are queued for reading (LossReader, tensor.ReadAsync);
// flush reads them. A model without those interfaces is read at once, as
// before (Forward's loss, GradSumSquarer's norm).
func (r *runner) queue(step int) (*pendingStep, error) {
	b, cfg := r.b, r.cfg
	p := &pendingStep{step: step, queued: time.Now(), lr: r.sched.LR(step)}
	ids, targets, err := r.data.Next()
	if err != nil {
		return nil, fmt.Errorf("train: step %d: data: %w", step, err)
	}
	stoppable, _ := b.(tensor.Interruptible)
	if !r.o.interrupt {
		stoppable = nil
	}
	if stoppable != nil {
		stoppable.SetInterrupt(func() bool { return r.ctx.Err() != nil })
	}
	r.model.ZeroGrad()
	if r.o.watch != nil {
		r.o.watch.BeginStep(step)
	}
	p.loss, err = r.forwardBackward(ids, targets, step)
	if stoppable != nil {
		stoppable.SetInterrupt(nil) // the update below runs whole or not at all
	}
	if err != nil {
		return nil, err
	}
	if r.o.extra != nil { // before the next forward (or a validation) replaces the router's statistics
		p.extra = r.o.extra(step)
	}
	var watched error
	if r.o.watch != nil {
		fields, err := r.o.watch.EndStep(step)
		if err != nil {
			watched = &watcherStop{err}
		}
		if len(fields) > 0 && p.extra == nil {
			p.extra = map[string]any{}
		}
		for k, v := range fields {
			p.extra[k] = v
		}
	}
	if r.o.lateExtra != nil {
		p.late = r.o.lateExtra(step)
	}
	_, hostNorm := r.model.(GradSumSquarer)
	devNorm, _ := r.model.(optim.DeviceGradSumSquarer)
	if hostNorm && devNorm == nil {
		// The norm only on the host: read the loss first (a NaN loss
		// stops the step before the update), then the norm.
		if err := r.stepOnHost(p); err != nil {
			return p, err
		}
		return p, watched
	}
	if p.normSq, err = r.opt.ClipStep(step, p.lr, cfg.GradClip, devNorm); err != nil {
		return nil, fmt.Errorf("train: step %d: %w", step, err)
	}
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("train: step %d: %w", step, err)
	}
	return p, watched
}

// watcherStop is the error of a StepWatcher's EndStep, carried from queue
// to the loop: the step is complete, and the run stops after it.
type watcherStop struct{ err error }

func (e *watcherStop) Error() string { return e.err.Error() }
func (e *watcherStop) Unwrap() error { return e.err }

// stepOnHost finishes a step whose gradient norm comes from the host
// (GradSumSquarer without DeviceGradSumSquarer): loss, norm, update.
func (r *runner) stepOnHost(p *pendingStep) error {
	loss, err := p.loss()
	if err != nil {
		return fmt.Errorf("train: step %d: reading the loss: %w", p.step, err)
	}
	if !finite(loss) {
		return r.diverged("loss", loss, p.step)
	}
	p.loss = func() (float64, error) { return loss, nil }
	if p.norm, err = r.gradNorm(); err != nil {
		return fmt.Errorf("train: step %d: %w", p.step, err)
	}
	if !finite(p.norm) {
		return r.diverged("gradient norm", p.norm, p.step)
	}
	return r.opt.Step(p.step, p.lr, optim.ClipScale(p.norm, r.cfg.GradClip))
}

// flush reads back the pending step (if any): its loss and gradient norm,
// stopping the run at a non-finite one (the update of that step was skipped
// on the device, and no checkpoint holds it), then records its metrics,
// validates when due and calls the step hook. The step's time runs from
// the end of the step before (or its own start, if later) to now: with
// steps queued one ahead, that is the device's time per step. On a backend
// that works on the host (hostSteps) it is queue's time.
func (r *runner) flush() error {
	p := r.pend
	if p == nil {
		return nil
	}
	r.pend = nil
	loss, err := p.loss()
	if err != nil {
		return fmt.Errorf("train: step %d: reading the loss: %w", p.step, err)
	}
	if !finite(loss) {
		return r.diverged("loss", loss, p.step)
	}
	norm := p.norm
	if p.normSq != nil {
		vals, err := p.normSq.Wait()
		if err != nil {
			return fmt.Errorf("train: step %d: reading the gradient norm: %w", p.step, err)
		}
		norm = math.Sqrt(vals[0])
	}
	if !finite(norm) {
		return r.diverged("gradient norm", norm, p.step)
	}
	if err := r.b.Err(); err != nil {
		return fmt.Errorf("train: step %d: %w", p.step, err)
	}
	now := time.Now()
	dt := now.Sub(p.queued)
	switch {
	case r.hostSteps:
		dt = p.issued.Sub(p.queued)
	case r.lastDone.After(p.queued):
		dt = now.Sub(r.lastDone)
	}
	r.lastDone = now
	r.trainTime += dt
	cfg := r.cfg
	tokens := float64(cfg.Batch * cfg.Seq)
	tps := tokens / dt.Seconds()
	m := StepMetrics{
		Step: p.step, Loss: loss, LR: p.lr, GradNorm: norm, TokensPerSec: tps,
		ElapsedS: r.elapsed(),
		Extra:    map[string]any{},
	}
	if f := r.model.FLOPsPerToken(); f > 0 {
		m.Extra["flops_per_s"] = f * tps
	}
	if !r.hostSteps {
		// The host's time to queue the step (data, forward, backward,
		// update) while the device ran the one before: when it nears the
		// step's time, the host, not the device, sets the pace.
		m.Extra["queue_ms"] = float64(p.issued.Sub(p.queued).Microseconds()) / 1e3
	}
	for k, v := range p.extra {
		m.Extra[k] = v
	}
	if p.late != nil {
		late, err := p.late()
		if err != nil {
			return fmt.Errorf("train: step %d: metrics: %w", p.step, err)
		}
		for k, v := range late {
			m.Extra[k] = v
		}
	}
	if r.o.val != nil && (p.step%r.o.valEvery == 0 || p.step == cfg.Steps) {
		vl, err := r.validate()
		if err != nil {
			return fmt.Errorf("train: step %d: validation: %w", p.step, err)
		}
		m.Extra["val_loss"] = vl
		m.Extra["val_ppl"] = math.Exp(vl)
		r.lastDone = time.Now()
	}
	r.res.Step, r.res.StepsRun, r.res.FinalLoss = p.step, r.res.StepsRun+1, m.Loss
	r.res.Losses = append(r.res.Losses, m.Loss)
	r.res.Elapsed = r.trainTime
	if s := r.trainTime.Seconds(); s > 0 {
		r.res.TokensPerSec = tokens * float64(r.res.StepsRun) / s
	}
	if r.sink != nil {
		if err := r.sink.record(m); err != nil {
			return err
		}
	}
	if r.o.hook != nil {
		r.o.hook(m)
	}
	return nil
}

// LossReader is an optional interface of an AsyncLoss model (layers.GPT,
// parallel/model.Model): LossAsync queues the read-back of the last
// ForwardAsync's loss and returns a function that waits for it, so Run
// can queue the next step before it reads this one's loss.
type LossReader interface {
	LossAsync() (func() (float64, error), error)
}

// forwardBackward runs the step's forward and backward and returns a
// function giving its loss. A model with AsyncLoss queues the two back to
// back; with LossReader too, the loss is only queued for reading (read in
// flush, after the next step is queued), else it is read after the
// backward. A plain model's loss is checked at once: a non-finite one
// stops the step before the backward.
func (r *runner) forwardBackward(ids, targets *tensor.Tensor, step int) (func() (float64, error), error) {
	if mb, ok := r.model.(MicroBatcher); ok {
		if err := mb.ForwardBackward(ids, targets); err != nil {
			return nil, fmt.Errorf("train: step %d: forward and backward: %w", step, err)
		}
		return r.readLoss(mb.ReadLoss, step)
	}
	async, ok := r.model.(AsyncLoss)
	var loss float64
	var err error
	if ok {
		err = async.ForwardAsync(ids, targets)
	} else {
		loss, err = r.model.Forward(ids, targets)
	}
	if err != nil {
		return nil, fmt.Errorf("train: step %d: forward: %w", step, err)
	}
	if !ok && !finite(loss) {
		return nil, r.diverged("loss", loss, step)
	}
	if err := r.model.Backward(); err != nil {
		return nil, fmt.Errorf("train: step %d: backward: %w", step, err)
	}
	if err := r.b.Err(); err != nil {
		return nil, fmt.Errorf("train: step %d: %w", step, err)
	}
	if !ok {
		return func() (float64, error) { return loss, nil }, nil
	}
	return r.readLoss(async.ReadLoss, step)
}

// readLoss is the loss of a step whose forward and backward are queued:
// queued for reading when the model is a LossReader, else read now
// (readNow) and checked.
func (r *runner) readLoss(readNow func() (float64, error), step int) (func() (float64, error), error) {
	if err := r.b.Err(); err != nil {
		return nil, fmt.Errorf("train: step %d: %w", step, err)
	}
	if lr, ok := r.model.(LossReader); ok {
		read, err := lr.LossAsync()
		if err != nil {
			return nil, fmt.Errorf("train: step %d: reading the loss: %w", step, err)
		}
		return read, nil
	}
	loss, err := readNow()
	if err != nil {
		return nil, fmt.Errorf("train: step %d: reading the loss: %w", step, err)
	}
	if !finite(loss) {
		return nil, r.diverged("loss", loss, step)
	}
	return func() (float64, error) { return loss, nil }, nil
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
	if err := r.flush(); err != nil { // the step before is complete: record it before saving it
		return err
	}
	if err := r.data.Seek(pos); err != nil {
		return fmt.Errorf("train: interrupted in step %d: %w", step, err)
	}
	if step-1 > 0 {
		if err := r.save(step-1, r.res.FinalLoss); err != nil {
			return err
		}
	}
	if err := r.waitSave(); err != nil {
		return err
	}
	return fmt.Errorf("train: stopped in step %d, which is dropped (checkpoint %s): %w", step, orNone(r.res.LastCheckpoint), context.Cause(r.ctx))
}

func (r *runner) diverged(what string, v float64, step int) error {
	if err := r.waitSave(); err != nil { // the checkpoint in flight is of a good step
		return fmt.Errorf("train: %s is %v at step %d; and %w", what, v, step, err)
	}
	return fmt.Errorf("train: %s is %v at step %d; last good checkpoint: %s", what, v, step, orNone(r.res.LastCheckpoint))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// save checkpoints the state after step (on a rank that writes
// checkpoints, WithRank0): it waits for the checkpoint in flight, if any,
// copies the parameters and moments to the host (TakeSnapshot: the part
// that must happen at the step boundary), and leaves the writing, the
// rename and the pruning of old checkpoints to a background writer while
// the next steps run; waitSave and pollSave collect it. The loss plot is
// redrawn here.
func (r *runner) save(step int, loss float64) error {
	if !r.o.rank0 || step == r.savedStep && (r.res.LastCheckpoint != "" || r.saving != nil) {
		return nil
	}
	if err := r.waitSave(); err != nil {
		return err
	}
	if w, ok := r.model.(interface{ WaitParams() error }); ok {
		// A distributed optimizer's all-gather writes the parameters
		// (this rank's runs too, with their own values): done first.
		if err := w.WaitParams(); err != nil {
			return err
		}
	}
	snap, err := TakeSnapshot(r.b, r.opt, r.snap)
	if err != nil {
		return fmt.Errorf("train: checkpoint %s: %w", CheckpointName(step), err)
	}
	snap.slices = r.slices
	r.snap = nil // in use until its write is done
	st := State{
		Step:        step,
		Data:        r.data.Position(),
		Loss:        loss,
		ElapsedS:    r.elapsed(),
		ModelConfig: r.modelCfg,
		TrainConfig: r.cfg,
		Replans:     r.sched.Replans,
		RunConfig:   r.runCfg,
		Layout:      r.layout,
		Ranks:       r.o.ranks,
		Tokenizer:   r.o.tokenizer,
	}
	out, keep, hook, sink := r.cfg.OutDir, r.cfg.KeepCheckpoints, r.o.saveHook, r.sink
	done := make(chan savedCheckpoint, 1)
	go func() {
		dir, err := snap.write(out, st, hook)
		if err == nil {
			sink.logf("checkpoint %s", dir)   // as soon as it is complete
			err = PruneCheckpoints(out, keep) // the completed ones only: a write in flight has no step-NNNNNN name yet
		}
		done <- savedCheckpoint{dir: dir, snap: snap, err: err}
	}()
	r.saving, r.savedStep = done, step
	if r.o.syncSaves {
		if err := r.waitSave(); err != nil {
			return err
		}
	}
	return r.sink.plot()
}

// savedCheckpoint is what the background writer of a checkpoint reports.
type savedCheckpoint struct {
	dir  string
	snap *Snapshot // free to be filled again
	err  error
}

// waitSave waits for the checkpoint being written, if any, and records it
// (Result.LastCheckpoint names the newest complete one).
func (r *runner) waitSave() error {
	if r.saving == nil {
		return nil
	}
	return r.saved(<-r.saving)
}

// pollSave records the checkpoint being written if it is done, without
// waiting, so that a failure stops the run at the next step.
func (r *runner) pollSave() error {
	if r.saving == nil {
		return nil
	}
	select {
	case c := <-r.saving:
		return r.saved(c)
	default:
		return nil
	}
}

func (r *runner) saved(c savedCheckpoint) error {
	r.saving, r.snap = nil, c.snap
	if c.err != nil {
		return c.err
	}
	r.res.LastCheckpoint = c.dir
	return nil
}
