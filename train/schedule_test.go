package train

import (
	"math"
	"testing"
)

func TestLearningRateBoundaries(t *testing.T) {
	c := Config{Steps: 100, LR: 1e-3, MinLR: 1e-4, Warmup: 10}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-15*math.Max(1, math.Abs(b)) }
	for _, tc := range []struct {
		step int
		want float64
	}{
		{-3, 0},
		{0, 0},
		{1, 1e-4},    // LR/Warmup
		{5, 5e-4},    // half-way up
		{10, 1e-3},   // end of warm-up: the peak
		{55, 5.5e-4}, // half-way down the cosine: (LR+MinLR)/2
		{100, 1e-4},  // last step: MinLR
		{1000, 1e-4}, // past the end
	} {
		if got := LearningRate(tc.step, c); !near(got, tc.want) {
			t.Errorf("LearningRate(%d) = %v, want %v", tc.step, got, tc.want)
		}
	}
	// Monotone: up during warm-up, down after.
	prev := 0.0
	for s := 1; s <= 100; s++ {
		lr := LearningRate(s, c)
		if s <= 10 && lr < prev || s > 10 && lr > prev {
			t.Fatalf("step %d: lr %v after %v breaks monotonicity", s, lr, prev)
		}
		prev = lr
	}
}

func TestLearningRateNoWarmup(t *testing.T) {
	c := Config{Steps: 10, LR: 2, MinLR: 0}
	if got := LearningRate(0, c); got != 2 {
		t.Errorf("step 0 without warm-up: %v, want LR", got)
	}
	if got := LearningRate(10, c); got != 0 {
		t.Errorf("last step: %v, want MinLR 0", got)
	}
	// Warm-up over the whole run: no decay.
	c.Warmup = 10
	if got := LearningRate(10, c); got != 2 {
		t.Errorf("all warm-up, last step: %v, want LR", got)
	}
	if got := LearningRate(3, c); math.Abs(got-0.6) > 1e-15 {
		t.Errorf("all warm-up, step 3: %v, want 0.6", got)
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	c := Config{}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig does not validate: %v", err)
	}
	// Meaningful zeros stay zero.
	if c.WeightDecay != 0 || c.GradClip != 0 || c.Warmup != 0 {
		t.Errorf("WithDefaults changed a meaningful zero: %+v", c)
	}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Steps = -1 }, "steps = -1"},
		{func(c *Config) { c.MinLR = 1 }, "min_lr"},
		{func(c *Config) { c.Warmup = 2000 }, "warmup = 2000"},
		{func(c *Config) { c.Beta2 = 1 }, "beta2 = 1"},
		{func(c *Config) { c.LR = math.NaN() }, "lr = NaN"},
		{func(c *Config) { c.GradClip = -1 }, "grad_clip"},
		{func(c *Config) { c.KeepCheckpoints = -2 }, "keep_checkpoints"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		mustContain(t, c.Validate(), tc.want)
	}
}
