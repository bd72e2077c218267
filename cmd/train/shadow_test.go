package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/overlaptest"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/train"
)

// shadowOf reads a step's "shadow" field: its worst relative difference
// and ULP distance, and the sites it names.
func shadowOf(t *testing.T, m train.StepMetrics) (rel, ulp float64, sites int, ok bool) {
	t.Helper()
	s, ok := m.Extra["shadow"].(map[string]any)
	if !ok {
		return 0, 0, 0, false
	}
	return s["rel"].(float64), s["ulp"].(float64), len(s["sites"].(map[string]any)), true
}

// TestShadowLayouts: --shadow-every on pipelined at every layout — TP 2,
// TP 2 with sequence parallelism, DP 2 (sites of one rank), MoE at TP 2 ×
// EP 2 with sequence parallelism (its expert site keeps collective on the
// CPU: the TP sites are shadowed) — reports on every sampled step and only then, every site within
// 1e-6 of collective (exactly 0 where a site's group has one rank), and
// the run's losses are the unshadowed run's bit for bit.
func TestShadowLayouts(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		sites int
		exact bool
	}{
		{[]string{"--tp", "2"}, 5, false},
		{[]string{"--tp", "2", "--sequence-parallel"}, 5, false},
		{[]string{"--dp", "2"}, 5, true},
		{append([]string{"--tp", "2", "--ep", "2", "--sequence-parallel"}, moe...), 3, false},
	} {
		name := strings.Join(tc.args, " ")
		args := append(tc.args, "--overlap", "pipelined", "--steps", "6")
		plain := metrics(t, trainRun(t, args...))
		shadowed := metrics(t, trainRun(t, append(args, "--shadow-every", "2")...))
		if len(plain) != 6 || len(shadowed) != 6 {
			t.Fatalf("%s: %d and %d steps, expected 6", name, len(plain), len(shadowed))
		}
		worst := 0.0
		for i, m := range shadowed {
			if math.Float64bits(m.Loss) != math.Float64bits(plain[i].Loss) {
				t.Errorf("%s: step %d: loss %v, the unshadowed run's %v: expected the same bits", name, m.Step, m.Loss, plain[i].Loss)
			}
			rel, ulp, sites, ok := shadowOf(t, m)
			if ok != (m.Step%2 == 0) {
				t.Errorf("%s: step %d: shadow field %v, expected one on the even steps only", name, m.Step, m.Extra["shadow"])
				continue
			}
			if !ok {
				continue
			}
			worst = max(worst, rel)
			switch {
			case sites != tc.sites:
				t.Errorf("%s: step %d: %d sites reported, expected %d", name, m.Step, sites, tc.sites)
			case !(rel <= 1e-6):
				t.Errorf("%s: step %d: relative difference %g, expected ≤ 1e-6", name, m.Step, rel)
			case tc.exact && (rel != 0 || ulp != 0):
				t.Errorf("%s: step %d: %g relative, %g ULP: expected collective's bits (groups of one rank)", name, m.Step, rel, ulp)
			}
		}
		t.Logf("%s: worst relative difference %.3g", name, worst)
	}
}

// perturbed puts in place of the pipelined strategy one whose forward
// scales a chunk of its output by 1 + 2⁻¹⁰, for the duration of a test.
func perturbed(t *testing.T) {
	t.Helper()
	old := rankStrategies
	rankStrategies = func(Config, comm.Comm, tensor.Backend) []overlap.Strategy {
		return []overlap.Strategy{overlaptest.Perturbed{Strategy: strategies.Pipelined{}, Scale: 1 + 1.0/1024}}
	}
	t.Cleanup(func() { rankStrategies = old })
}

// TestShadowFailAbove: a deliberately perturbed strategy is caught at the
// first sampled step; with fail_above the run stops after that step with
// a checkpoint of it on every rank and an error naming the site, the
// step, both values and the bound; without, the run goes on and records
// the difference.
func TestShadowFailAbove(t *testing.T) {
	perturbed(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "c.json")
	if err := os.WriteFile(conf, []byte(`{"shadow": {"every": 2, "fail_above": 1e-6}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	err := run(context.Background(), par(out, "--config", conf, "--tp", "2", "--sequence-parallel", "--overlap", "pipelined", "--steps", "6"))
	if err == nil {
		t.Fatal("the perturbed strategy ran 6 steps: expected fail_above to stop the run after step 2")
	}
	for _, want := range []string{"stopped after step 2", train.CheckpointName(2), "shadow: step 2: site blocks.", "(all-gather-matmul, pipelined)", "fail_above 1e-06", "and collective"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q: expected it to say %q", err, want)
		}
	}
	t.Logf("stopped: %v", err)
	for r := range 2 {
		if _, err := os.Stat(filepath.Join(train.RankDir(out, r), train.CheckpointName(2), "state.json")); err != nil {
			t.Errorf("rank %d: no checkpoint of step 2: %v", r, err)
		}
	}
	recs := metrics(t, out)
	if len(recs) != 2 {
		t.Fatalf("%d steps recorded, expected 2", len(recs))
	}
	if rel, _, _, ok := shadowOf(t, recs[1]); !ok || !(rel > 1e-4) {
		t.Errorf("step 2's shadow field %v: expected the perturbation (≈ 1e-3)", recs[1].Extra["shadow"])
	}

	recs = metrics(t, trainRun(t, "--tp", "2", "--sequence-parallel", "--overlap", "pipelined", "--steps", "4", "--shadow-every", "2"))
	if len(recs) != 4 {
		t.Fatalf("without fail_above: %d steps, expected 4", len(recs))
	}
	for _, m := range recs[1:2] {
		if rel, _, _, ok := shadowOf(t, m); !ok || !(rel > 1e-4) {
			t.Errorf("without fail_above: step %d's shadow field %v: expected the perturbation", m.Step, m.Extra["shadow"])
		}
	}
}

// TestShadowConfig: the "shadow" section without every samples at the
// default rate, which config.json then records; a rate of 0 given
// explicitly, shadow mode on a run with nothing to compare, and a site
// pattern that selects nothing are refused, each saying why.
func TestShadowConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, js string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	out := filepath.Join(dir, "out")
	if err := run(context.Background(), par(out, "--config", write("d.json", `{"shadow": {"sites": ["matmul-reduce-scatter"]}}`),
		"--tp", "2", "--sequence-parallel", "--overlap", "pipelined", "--steps", "2")); err != nil {
		t.Fatal(err)
	}
	if cfg := readConfig(t, out); cfg.Shadow == nil || cfg.Shadow.Every != overlap.DefaultShadowEvery {
		t.Errorf("config.json shadow %+v, expected every %d", cfg.Shadow, overlap.DefaultShadowEvery)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shadow-every", "5"}, "--shadow-every 5 cannot take effect: a run of one rank in one process has no communication sites"},
		{[]string{"--tp", "2", "--shadow-every", "5"}, "--shadow-every 5 cannot take effect: every communication site runs collective"},
		{[]string{"--tp", "2", "--overlap", "pipelined", "--shadow-every", "0"}, "shadow: every 0 (--shadow-every): expected a number of steps ≥ 1"},
		{[]string{"--tp", "2", "--overlap", "pipelined", "--shadow-every", "-3"}, "shadow: every -3"},
		{[]string{"--tp", "2", "--config", write("e.json", `{"shadow": {"every": 3}}`)}, "the \"shadow\" section cannot take effect: every communication site runs collective"},
		{[]string{"--tp", "2", "--overlap", "pipelined", "--config", write("f.json", `{"shadow": {"every": 3, "fail_above": -1}}`)}, "fail_above -1"},
		{[]string{"--tp", "2", "--overlap", "pipelined", "--config", write("g.json", `{"shadow": {"sites": ["blocks.9.*"]}}`)}, `"blocks.9.*" matches no communication site of this model`},
		{[]string{"--tp", "2", "--overlap", "pipelined", "--config", write("h.json", `{"overlap": {"sites": {"matmul-all-reduce": "collective"}}, "shadow": {"sites": ["matmul-all-reduce"]}}`)},
			`"matmul-all-reduce" matches only sites that run collective`},
	} {
		err := run(context.Background(), par(filepath.Join(t.TempDir(), "out"), append(tc.args, "--steps", "2")...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, expected one saying %q", tc.args, err, tc.want)
		}
	}
	if _, err := loadConfig([]string{"--tp", "2", "--overlap", "auto", "--shadow-every", "5"}); err != nil {
		t.Errorf("--overlap auto: %v (auto may pick pipelined: shadow mode is allowed)", err)
	}
}
