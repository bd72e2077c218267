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

// TestReplanned compares Replanned with the decay written out for each
// case: no replan (the WarmupCosine bit for bit), one replan in the decay
// (the rest of the cosine from the resumed step's progress), one in the
// warm-up (the decay over the new length), one at the end of a finished
// run (Min after), one of a run that was all warm-up, and two in a row;
// every replanned schedule is continuous at its replan, falls after the
// warm-up and ends at Min.
func TestReplanned(t *testing.T) {
	base := WarmupCosine{Peak: 1e-3, Min: 1e-4, Warmup: 10, Steps: 100}
	cos := func(p float64) float64 { return base.Min + (base.Peak-base.Min)*(1+math.Cos(math.Pi*math.Min(p, 1)))/2 }
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-14*math.Max(1e-4, math.Abs(b)) }
	for _, tc := range []struct {
		name    string
		s       Replanned
		ref     func(step int) float64 // after the first replan's step
		warmEnd bool                   // the warm-up lasts the whole first plan
	}{
		{"decay", Replanned{WarmupCosine: withSteps(base, 300), Replans: []Replan{{At: 40, Steps: 100}}}, func(s int) float64 {
			pk := 30.0 / 90
			return cos(pk + (1-pk)*float64(s-40)/260)
		}, false},
		{"shorter", Replanned{WarmupCosine: withSteps(base, 60), Replans: []Replan{{At: 40, Steps: 100}}}, func(s int) float64 {
			pk := 30.0 / 90
			return cos(pk + (1-pk)*float64(s-40)/20)
		}, false},
		{"warm-up", Replanned{WarmupCosine: withSteps(base, 200), Replans: []Replan{{At: 4, Steps: 100}}}, func(s int) float64 {
			return withSteps(base, 200).LR(s)
		}, false},
		{"finished", Replanned{WarmupCosine: withSteps(base, 150), Replans: []Replan{{At: 100, Steps: 100}}}, func(int) float64 { return base.Min }, false},
		{"all warm-up", Replanned{WarmupCosine: withSteps(base, 50), Replans: []Replan{{At: 10, Steps: 10}}}, func(s int) float64 {
			return cos(float64(s-10) / 40)
		}, true},
		{"twice", Replanned{WarmupCosine: withSteps(base, 400), Replans: []Replan{{At: 40, Steps: 100}, {At: 100, Steps: 300}}}, func(s int) float64 {
			pk := 30.0 / 90
			if s <= 100 {
				return cos(pk + (1-pk)*float64(s-40)/260)
			}
			p2 := pk + (1-pk)*60/260
			return cos(p2 + (1-p2)*float64(s-100)/300)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := tc.s.Replans[0]
			old := withSteps(base, first.Steps)
			if tc.warmEnd {
				old.Warmup = first.Steps
			}
			s := tc.s
			s.Warmup = old.Warmup
			prev := math.Inf(1)
			for step := 0; step <= s.Steps+5; step++ {
				got := s.LR(step)
				want := old.LR(step)
				if step > first.At {
					want = tc.ref(step)
					if step < s.Warmup {
						want = old.LR(step)
					}
				}
				if step <= first.At && got != want || !near(got, want) {
					t.Fatalf("LR(%d) = %v, want %v", step, got, want)
				}
				if step >= max(s.Warmup, first.At) {
					if got > prev*(1+1e-15) {
						t.Fatalf("LR(%d) = %v rises after %v", step, got, prev)
					}
					prev = got
				}
			}
			// Continuous: the decay after the replan starts where the old plan was.
			if k := first.At; k >= s.Warmup && !near(tc.ref(k), old.LR(k)) {
				t.Fatalf("at the replan's step %d the new decay gives %v, the old plan %v", k, tc.ref(k), old.LR(k))
			}
			if got := s.LR(s.Steps); !near(got, base.Min) {
				t.Fatalf("last step: %v, want Min %v", got, base.Min)
			}
		})
	}
	// No replans: the WarmupCosine itself.
	for step := range 120 {
		if got, want := (Replanned{WarmupCosine: base}).LR(step), base.LR(step); got != want {
			t.Fatalf("LR(%d) without replans = %v, the WarmupCosine's %v", step, got, want)
		}
	}
}

func withSteps(c WarmupCosine, steps int) WarmupCosine {
	c.Steps = steps
	return c
}

// TestDecayEnded: DecayEnded(step) holds exactly when step and every step
// after it run at Min whatever the peak, checked by brute force on LR with
// two peaks, for schedules without replans, with replans in the warm-up,
// in the decay, after its end, of a run that was all warm-up, twice, and
// without a decay phase.
func TestDecayEnded(t *testing.T) {
	base := WarmupCosine{Peak: 1e-3, Min: 1e-4, Warmup: 10, Steps: 100}
	scheds := map[string]Replanned{
		"plain":          {WarmupCosine: base},
		"no warm-up":     {WarmupCosine: WarmupCosine{Peak: 1e-3, Min: 1e-4, Steps: 50}},
		"all warm-up":    {WarmupCosine: withSteps(base, 10)},
		"decay":          {WarmupCosine: withSteps(base, 300), Replans: []Replan{{At: 40, Steps: 100}}},
		"shorter":        {WarmupCosine: withSteps(base, 60), Replans: []Replan{{At: 40, Steps: 100}}},
		"warm-up":        {WarmupCosine: withSteps(base, 200), Replans: []Replan{{At: 4, Steps: 100}}},
		"finished":       {WarmupCosine: withSteps(base, 150), Replans: []Replan{{At: 100, Steps: 100}}},
		"ended, shorter": {WarmupCosine: withSteps(base, 130), Replans: []Replan{{At: 120, Steps: 100}}},
		"all warm-up, longer": {WarmupCosine: withSteps(base, 50),
			Replans: []Replan{{At: 10, Steps: 10}}},
		"twice":          {WarmupCosine: withSteps(base, 400), Replans: []Replan{{At: 40, Steps: 100}, {At: 100, Steps: 300}}},
		"finished twice": {WarmupCosine: withSteps(base, 500), Replans: []Replan{{At: 40, Steps: 100}, {At: 100, Steps: 100}}},
	}
	var ended, running int
	for name, s := range scheds {
		other := s
		other.Peak = 7 * s.Peak
		atMin := func(k int) bool { return s.LR(k) == s.Min && other.LR(k) == other.Min }
		last := s.Steps + 20
		for step := 0; step <= last; step++ {
			want := true
			for k := step; k <= last; k++ {
				want = want && atMin(k)
			}
			if got := s.DecayEnded(step); got != want {
				t.Fatalf("%s: DecayEnded(%d) = %v, want %v (LR %v, with peak %v: %v)", name, step, got, want, s.LR(step), other.Peak, other.LR(step))
			}
			if want {
				ended++
			} else {
				running++
			}
		}
	}
	if ended == 0 || running == 0 {
		t.Fatalf("%d steps ended, %d not: the cases test one side only", ended, running)
	}
}
