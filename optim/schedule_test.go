package optim

import (
	"math"
	"testing"
)

func TestWarmupCosineBoundaries(t *testing.T) {
	c := WarmupCosine{Steps: 100, Peak: 1e-3, Min: 1e-4, Warmup: 10}
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
		if got := c.LR(tc.step); !near(got, tc.want) {
			t.Errorf("LR(%d) = %v, want %v", tc.step, got, tc.want)
		}
	}
	// Monotone: up during warm-up, down after.
	prev := 0.0
	for s := 1; s <= 100; s++ {
		lr := c.LR(s)
		if s <= 10 && lr < prev || s > 10 && lr > prev {
			t.Fatalf("step %d: lr %v after %v breaks monotonicity", s, lr, prev)
		}
		prev = lr
	}
}

func TestWarmupCosineNoWarmup(t *testing.T) {
	c := WarmupCosine{Steps: 10, Peak: 2, Min: 0}
	if got := c.LR(0); got != 2 {
		t.Errorf("step 0 without warm-up: %v, want LR", got)
	}
	if got := c.LR(10); got != 0 {
		t.Errorf("last step: %v, want MinLR 0", got)
	}
	// Warm-up over the whole run: no decay.
	c.Warmup = 10
	if got := c.LR(10); got != 2 {
		t.Errorf("all warm-up, last step: %v, want LR", got)
	}
	if got := c.LR(3); math.Abs(got-0.6) > 1e-15 {
		t.Errorf("all warm-up, step 3: %v, want 0.6", got)
	}
}
