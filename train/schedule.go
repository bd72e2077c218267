package train

import "math"

// LearningRate is the learning rate of optimizer step step (1-based; step 0
// is "before training" and gives 0 when there is a warm-up). It rises
// linearly from 0 to c.LR over the first c.Warmup steps, then follows a
// half cosine from c.LR down to c.MinLR, reached exactly at step c.Steps.
// Steps past c.Steps stay at c.MinLR. It is a pure function of its arguments.
func LearningRate(step int, c Config) float64 {
	if step < 0 {
		step = 0
	}
	if step < c.Warmup {
		return c.LR * float64(step) / float64(c.Warmup)
	}
	if step >= c.Steps {
		if c.Warmup >= c.Steps {
			return c.LR // all warm-up, no decay phase
		}
		return c.MinLR
	}
	// Warmup <= step < Steps.
	p := float64(step-c.Warmup) / float64(c.Steps-c.Warmup)
	return c.MinLR + 0.5*(c.LR-c.MinLR)*(1+math.Cos(math.Pi*p))
}
