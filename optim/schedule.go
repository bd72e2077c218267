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
	p := float64(step-s.Warmup) / float64(s.Steps-s.Warmup)
	return s.Min + 0.5*(s.Peak-s.Min)*(1+math.Cos(math.Pi*p))
}
