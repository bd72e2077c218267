package optim

import "math"

// WarmupCosine is the learning-rate schedule of GPT-style training: a
// linear warm-up from 0 to Peak over the first Warmup steps, then a half
// cosine from Peak down to Min, reached exactly at step Steps; steps past
// Steps stay at Min.
type WarmupCosine struct {
	Peak   float64 // the learning rate at the end of the warm-up
	Min    float64 // the learning rate at step Steps and after
	Warmup int     // steps of linear warm-up (0: none)
	Steps  int     // the step at which the decay reaches Min
}

// LR is the learning rate of optimizer step step (1-based; step 0 is
// "before training" and gives 0 when there is a warm-up). It is a pure
// function of its arguments.
func (s WarmupCosine) LR(step int) float64 {
	if step < 0 {
		step = 0
	}
	if step < s.Warmup {
		return s.Peak * float64(step) / float64(s.Warmup)
	}
	if step >= s.Steps {
		if s.Warmup >= s.Steps {
			return s.Peak // all warm-up, no decay phase
		}
		return s.Min
	}
	// Warmup <= step < Steps.
	return s.cosine(float64(step-s.Warmup) / float64(s.Steps-s.Warmup))
}

// Replan records that a run changed its length at a step (a resume that
// asks for another number of steps): up to step At the schedule was the one
// planned for Steps steps.
type Replan struct {
	At    int `json:"at"`    // the step the run was resumed from
	Steps int `json:"steps"` // the run's length before the change
}

// Replanned is a WarmupCosine whose run changed its length on the way.
// Up to the first replan's step the learning rate is the one planned then;
// from each replan's step on, what was left of the cosine decay at that
// step spreads over the steps up to the new length, so the learning rate
// goes on from where it was (no jump) and reaches Min at the last step. A
// replan inside the warm-up leaves the warm-up as it was, and the decay
// runs from its end to the new length; a replan after the decay ended (a
// finished run made longer) keeps Min. Steps is the final length; with no
// replans Replanned is its WarmupCosine, bit for bit.
type Replanned struct {
	// WarmupCosine is the schedule as planned last: Steps is the run's
	// final length.
	WarmupCosine
	// Replans are the changes of length, in the order made (At increasing).
	Replans []Replan
}

// LR is the learning rate of optimizer step step (1-based), a pure
// function of the schedule and step.
func (s Replanned) LR(step int) float64 {
	if len(s.Replans) == 0 || step <= s.Replans[0].At {
		return s.first().LR(step)
	}
	if step < s.Warmup {
		return s.Peak * float64(step) / float64(s.Warmup)
	}
	return s.cosine(s.progress(step))
}

// DecayEnded reports whether the decay has reached Min by step: step and
// every step after it run at Min, whatever Peak. A schedule without a
// decay phase (all warm-up) never ends so; a step in the warm-up is not
// past it. A run resumed at step k changes no learning rate by another
// Peak when DecayEnded(k+1).
func (s Replanned) DecayEnded(step int) bool {
	if len(s.Replans) == 0 || step <= s.Replans[0].At {
		f := s.first()
		return f.Warmup < f.Steps && step >= f.Steps
	}
	return step >= s.Warmup && s.progress(step) >= 1
}

// first is the schedule as planned before the first replan (all of it
// when there is none).
func (s Replanned) first() WarmupCosine {
	f := s.WarmupCosine
	if len(s.Replans) > 0 {
		f.Steps = s.Replans[0].Steps
	}
	return f
}

// progress is the decay's progress at step, a step after the first
// replan and not in the warm-up. It is piecewise linear in the step: from
// the anchor (the end of the warm-up, or the last replan after it) at p0,
// to 1 at the length planned then.
func (s Replanned) progress(step int) float64 {
	anchor, p0, length := s.Warmup, 0.0, s.Replans[0].Steps
	for i, r := range s.Replans {
		if step <= r.At {
			break
		}
		if r.At > anchor {
			p0, anchor = decayProgress(r.At, anchor, p0, length), r.At
		}
		length = s.Steps
		if i+1 < len(s.Replans) {
			length = s.Replans[i+1].Steps
		}
	}
	return decayProgress(step, anchor, p0, length)
}

// decayProgress is the progress of the decay at step, going linearly from
// p0 at anchor to 1 at length (and staying at 1 after; at p0 when there is
// no step left to decay over).
func decayProgress(step, anchor int, p0 float64, length int) float64 {
	if length <= anchor {
		return p0
	}
	return math.Min(1, p0+(1-p0)*float64(step-anchor)/float64(length-anchor))
}

// cosine is the learning rate at progress p of the decay, as LR computes it.
func (s WarmupCosine) cosine(p float64) float64 {
	return s.Min + 0.5*(s.Peak-s.Min)*(1+math.Cos(math.Pi*p))
}
