package overlap_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/overlaptest"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
)

// siteRun is what one rank's sites of every kind gave in one step.
type siteRun struct {
	vals map[string][]float64 // tensor → its values after the step
}

// runSites builds one site of each TP kind with ch on this rank and runs
// them for steps steps (forward, then backward, on inputs that depend on
// the rank and the step), starting each step with sh.BeginStep when sh is
// not nil and ending it with sh.EndStep; it returns every output and
// gradient of the last step, and the reports of the sampled steps.
func runSites(c comm.Comm, b tensor.Backend, dt tensor.DType, ch *overlap.Chooser, sh *overlap.Shadow, steps int) (siteRun, []map[string]any, error) {
	P, me := c.Size(), c.Rank()
	const n, K = 5, 24
	outs := []int{12, 20}
	N := P * n
	sp := func(name string, o ...int) overlap.Spec {
		return overlap.Spec{Name: name, Group: c, Backend: b, K: K, Outs: o, DType: dt, Rows: n}
	}
	agmm, err := ch.AllGatherMatmul(sp("blocks.0.attn.qkv", outs...))
	if err != nil {
		return siteRun{}, nil, err
	}
	defer agmm.Close()
	mmrs, err := ch.MatmulReduceScatter(sp("blocks.0.attn.out", outs[0]))
	if err != nil {
		return siteRun{}, nil, err
	}
	defer mmrs.Close()
	mmar, err := ch.MatmulAllReduce(sp("blocks.0.mlp.down", outs[0]))
	if err != nil {
		return siteRun{}, nil, err
	}
	defer mmar.Close()
	if sh != nil {
		if err := sh.CheckUsed(); err != nil {
			return siteRun{}, nil, err
		}
	}
	rng := testutil.Rng(uint64(17 + me))
	rnd := func(r, cols int) *tensor.Tensor {
		h := testutil.Rand(rng, dt, r, cols)
		t := b.Zeros(dt, r, cols)
		b.Upload(t, h)
		return t
	}
	// The weights and their gradients persist over the steps (the
	// gradients accumulate from a random start).
	ws := []*tensor.Tensor{rnd(outs[0], K), rnd(outs[1], K)}
	dws := []*tensor.Tensor{rnd(outs[0], K), rnd(outs[1], K)}
	w2, dw2 := rnd(outs[0], K), rnd(outs[0], K)
	run := siteRun{vals: map[string][]float64{}}
	var reports []map[string]any
	for step := 1; step <= steps; step++ {
		if sh != nil {
			sh.BeginStep(step)
		}
		x := rnd(n, K)
		xFull := b.Zeros(dt, N, K)
		ys := []*tensor.Tensor{b.Zeros(dt, N, outs[0]), b.Zeros(dt, N, outs[1])}
		if err := agmm.Forward(ys, xFull, x, ws); err != nil {
			return run, nil, err
		}
		douts := []*tensor.Tensor{rnd(N, outs[0]), rnd(N, outs[1])}
		dx := b.Zeros(dt, n, K)
		if err := waitOn(agmm.Backward(dx, dws, douts, xFull, ws)); err != nil {
			return run, nil, err
		}
		xe := rnd(N, K)
		ye := b.Zeros(dt, n, outs[0])
		if err := mmrs.Forward(ye, xe, w2); err != nil {
			return run, nil, err
		}
		dxe := b.Zeros(dt, N, K)
		if err := waitOn(mmrs.Backward(dxe, dw2, rnd(n, outs[0]), xe, w2)); err != nil {
			return run, nil, err
		}
		a := rnd(2*n+1, K)
		ar := b.Zeros(dt, 2*n+1, outs[0])
		if err := waitOn(mmar.Run(ar, []*tensor.Tensor{a}, []*tensor.Tensor{w2}, true)); err != nil {
			return run, nil, err
		}
		if sh != nil {
			rep, err := sh.EndStep(step)
			if err != nil {
				return run, reports, err
			}
			if rep != nil {
				reports = append(reports, rep)
			}
		}
		if step == steps {
			for name, t := range map[string]*tensor.Tensor{"agmm.xFull": xFull, "agmm.out0": ys[0], "agmm.out1": ys[1], "agmm.dx": dx,
				"agmm.dw0": dws[0], "agmm.dw1": dws[1], "mmrs.out": ye, "mmrs.dx": dxe, "mmrs.dw": dw2, "mmar.out": ar} {
				run.vals[name] = testutil.Download(b, t)
			}
		}
	}
	return run, reports, b.Err()
}

func waitOn(w comm.Work, err error) error {
	if err != nil {
		return err
	}
	return w.Wait(nil)
}

func every(n int) overlap.ShadowConfig { return overlap.ShadowConfig{Every: n} }

// shadowed runs runSites on a world of P with strategy s, shadowed by cfg,
// and unshadowed, and returns the rank's runs and reports.
func shadowed(t *testing.T, P int, dt tensor.DType, s overlap.Strategy, cfg overlap.ShadowConfig, steps int) (with, without []siteRun, reports [][]map[string]any, errs []error) {
	t.Helper()
	with, without = make([]siteRun, P), make([]siteRun, P)
	reports, errs = make([][]map[string]any, P), make([]error, P)
	var mu sync.Mutex
	onRanks(t, P, func(c comm.Comm, b tensor.Backend) error {
		sh, err := overlap.NewShadow(cfg, c, b, nil, dt)
		if err != nil {
			return err
		}
		run, _, err := runSites(c, b, dt, overlap.Single(s), nil, steps)
		if err != nil {
			return err
		}
		ch, err := overlap.NewChooser(overlap.Config{Default: s.Name()}, []overlap.Strategy{s}, nil, overlap.WithShadow(sh))
		if err != nil {
			return err
		}
		srun, sreps, serr := runSites(c, b, dt, ch, sh, steps)
		mu.Lock()
		defer mu.Unlock()
		without[c.Rank()], with[c.Rank()], reports[c.Rank()], errs[c.Rank()] = run, srun, sreps, serr
		return nil
	})
	return with, without, reports, errs
}

// worst reads the report's worst relative difference and ULP distance.
func worst(rep map[string]any) (rel, ulp float64) {
	m := rep["shadow"].(map[string]any)
	return m["rel"].(float64), m["ulp"].(float64)
}

// slotDiffs lists "site.slot rel ulp" of a report, sorted.
func slotDiffs(rep map[string]any) map[string][2]float64 {
	out := map[string][2]float64{}
	for site, v := range rep["shadow"].(map[string]any)["sites"].(map[string]any) {
		for slot, d := range v.(map[string]any) {
			dm := d.(map[string]any)
			out[site+"."+slot] = [2]float64{dm["rel"].(float64), dm["ulp"].(float64)}
		}
	}
	return out
}

// TestShadowPipelined: pipelined shadowed by collective on worlds of 1–4
// ranks, float32 and float64: the training results are the unshadowed
// run's bit for bit (the weight gradients' accumulation included), every
// sampled step is reported by every rank alike, the differences are
// within 1e-6 (float32) or 1e-12 (float64), and the sites that give
// collective's bits by construction report exactly 0: every site on one
// rank; on two ranks the reduce-scatters (two addends: a + b either way)
// and the gathers, with every row product of these shapes computed as in
// the whole product.
func TestShadowPipelined(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		for _, P := range []int{1, 2, 3, 4} {
			t.Run(fmt.Sprintf("%v/P=%d", dt, P), func(t *testing.T) {
				with, without, reports, errs := shadowed(t, P, dt, strategies.Pipelined{}, every(2), 4)
				tol := 1e-6
				if dt == tensor.Float64 {
					tol = 1e-12
				}
				for r := range P {
					if errs[r] != nil {
						t.Fatalf("rank %d: %v", r, errs[r])
					}
					for name, v := range without[r].vals {
						if !slices.Equal(math64bits(with[r].vals[name]), math64bits(v)) {
							t.Errorf("rank %d: %s differs from the unshadowed run's", r, name)
						}
					}
					if len(reports[r]) != 2 {
						t.Fatalf("rank %d: %d reports of 4 steps sampled every 2, expected 2", r, len(reports[r]))
					}
					for i, rep := range reports[r] {
						if fmt.Sprint(rep) != fmt.Sprint(reports[0][i]) {
							t.Errorf("rank %d: report %v, rank 0's %v: expected the merged report on every rank", r, rep, reports[0][i])
						}
						diffs := slotDiffs(rep)
						if len(diffs) != 7 { // out, dx, dW of two sites, out of one
							t.Errorf("report %d: %d slots %v, expected 7", i, len(diffs), diffs)
						}
						for slot, d := range diffs {
							exact := P == 1 || P == 2 && slot != "blocks.0.attn.out.dW"
							switch {
							case !(d[0] <= tol):
								t.Errorf("P=%d step %d: %s: relative difference %g, expected ≤ %g", P, 2*(i+1), slot, d[0], tol)
							case exact && (d[0] != 0 || d[1] != 0):
								t.Errorf("P=%d step %d: %s: %g relative, %g ULP: expected collective's bits", P, 2*(i+1), slot, d[0], d[1])
							}
						}
					}
				}
				rel, _ := worst(reports[0][0])
				t.Logf("pipelined against collective, %v, %d ranks: worst relative difference %.3g", dt, P, rel)
			})
		}
	}
}

func math64bits(v []float64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = math.Float64bits(x)
	}
	return out
}

// TestShadowCatchesPerturbed: a strategy whose forward scales one chunk
// of its output by 1 + 2⁻¹⁰ is caught at the first sampled step, in
// every site's out (and nowhere else: its backward is pipelined's), and
// fail_above turns it into an error naming the step, the site, both
// values and the bound, on every rank; without fail_above the run goes on
// and the summary flags the sites.
func TestShadowCatchesPerturbed(t *testing.T) {
	bad := overlaptest.Perturbed{Strategy: strategies.Pipelined{}, Scale: 1 + 1.0/1024}
	bound := 1e-6
	cfg := overlap.ShadowConfig{Every: 3, FailAbove: &bound}
	_, _, reports, errs := shadowed(t, 2, tensor.Float32, bad, cfg, 4)
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: no error, expected fail_above to stop at step 3", r)
		}
		for _, want := range []string{"step 3", "blocks.0.attn", "pipelined", "out", "fail_above 1e-06", "collective"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d: %v: expected it to name %q", r, err, want)
			}
		}
		if len(reports[r]) != 0 {
			t.Errorf("rank %d: %d reports returned beside the error", r, len(reports[r]))
		}
	}
	t.Logf("caught: %v", errs[0])

	// Without fail_above: reports, and the summary flags every site.
	var summary []string
	onRanks(t, 2, func(c comm.Comm, b tensor.Backend) error {
		sh, err := overlap.NewShadow(every(3), c, b, nil, tensor.Float32)
		if err != nil {
			return err
		}
		ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined"}, []overlap.Strategy{bad}, nil, overlap.WithShadow(sh))
		if err != nil {
			return err
		}
		_, reps, err := runSites(c, b, tensor.Float32, ch, sh, 4)
		if err != nil {
			return err
		}
		if len(reps) != 1 {
			return fmt.Errorf("%d reports, expected 1 (step 3)", len(reps))
		}
		for slot, d := range slotDiffs(reps[0]) {
			perturbed := strings.HasSuffix(slot, ".out")
			if perturbed && !(d[0] > 1e-4) {
				return fmt.Errorf("%s: relative difference %g, expected the perturbation (≈ 1e-3)", slot, d[0])
			}
			if !perturbed && !(d[0] <= 1e-6) {
				return fmt.Errorf("%s: relative difference %g, expected ≤ 1e-6 (not perturbed)", slot, d[0])
			}
		}
		if sh.Failure() != nil {
			return fmt.Errorf("failure %v without fail_above", sh.Failure())
		}
		if c.Rank() == 0 {
			summary = sh.Summary()
		}
		return nil
	})
	text := strings.Join(summary, "\n")
	t.Logf("summary:\n%s", text)
	if n := strings.Count(text, "  <-\n"); n != 3 {
		t.Errorf("summary flags %d sites, expected the 3 perturbed ones:\n%s", n, text)
	}
	if !strings.Contains(text, "3 of 3 sites above the f32 tolerance 1e-05") {
		t.Errorf("summary %q: expected its last line to count the flagged sites", text)
	}
}

// TestShadowPatterns: the sites patterns select by kind or layer name; a
// pattern that selects nothing, or only collective sites, and a run whose
// sites all run collective, are refused by CheckUsed.
func TestShadowPatterns(t *testing.T) {
	bad := 0.0
	for _, tc := range []struct {
		cfg     overlap.ShadowConfig
		overlap overlap.Config
		sites   int    // shadowed sites
		err     string // CheckUsed's
	}{
		{cfg: every(1), overlap: overlap.Config{Default: "pipelined"}, sites: 3},
		{cfg: overlap.ShadowConfig{Every: 1, Sites: []string{"matmul-reduce-scatter"}}, overlap: overlap.Config{Default: "pipelined"}, sites: 1},
		{cfg: overlap.ShadowConfig{Every: 1, Sites: []string{"blocks.*.attn.*"}}, overlap: overlap.Config{Default: "pipelined"}, sites: 2},
		{cfg: overlap.ShadowConfig{Every: 1, Sites: []string{"blocks.7.*"}}, overlap: overlap.Config{Default: "pipelined"}, err: `"blocks.7.*" matches no communication site`},
		{cfg: every(1), overlap: overlap.Config{}, err: "every communication site of this run runs collective"},
		{cfg: overlap.ShadowConfig{Every: 1, Sites: []string{"matmul-all-reduce", "blocks.0.attn.qkv"}},
			overlap: overlap.Config{Default: "pipelined", Sites: map[string]string{"matmul-all-reduce": "collective"}},
			sites:   1, err: `"matmul-all-reduce" matches only sites that run collective`},
		{cfg: overlap.ShadowConfig{Every: 2, FailAbove: &bad}, overlap: overlap.Config{Default: "pipelined"}, sites: 3},
	} {
		sh, err := overlap.NewShadow(tc.cfg, nil, nil, nil, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := overlap.NewChooser(tc.overlap, []overlap.Strategy{strategies.Pipelined{}}, nil, overlap.WithShadow(sh))
		if err != nil {
			t.Fatal(err)
		}
		onRanks(t, 1, func(c comm.Comm, b tensor.Backend) error {
			_, _, err := runSites(c, b, tensor.Float32, ch, nil, 0)
			return err
		})
		err = sh.CheckUsed()
		if got := len(sh.Sites()); got != tc.sites {
			t.Errorf("%+v: %d sites shadowed %v, expected %d", tc.cfg, got, sh.Sites(), tc.sites)
		}
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%+v: error %v, expected one saying %q", tc.cfg, err, tc.err)
		}
	}
}

func TestShadowConfigValidate(t *testing.T) {
	neg, inf := -1.0, math.Inf(1)
	for _, tc := range []struct {
		cfg overlap.ShadowConfig
		err string
	}{
		{overlap.ShadowConfig{}, ""},
		{overlap.ShadowConfig{Every: 10, Sites: []string{"expert"}}, ""},
		{overlap.ShadowConfig{Every: -1}, "every -1"},
		{overlap.ShadowConfig{Every: 1, Sites: []string{"blocks.[0"}}, "site pattern"},
		{overlap.ShadowConfig{Every: 1, Sites: []string{""}}, "not an empty one"},
		{overlap.ShadowConfig{Every: 1, FailAbove: &neg}, "fail_above -1"},
		{overlap.ShadowConfig{Every: 1, FailAbove: &inf}, "fail_above +Inf"},
		{overlap.ShadowConfig{Sites: []string{"expert"}}, ""},
	} {
		err := tc.cfg.Validate()
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, expected %q", tc.cfg, err, tc.err)
		}
	}
	if sh, err := overlap.NewShadow(overlap.ShadowConfig{}, nil, nil, nil, tensor.Float32); err != nil || sh.Config().Every != overlap.DefaultShadowEvery {
		t.Errorf("NewShadow of every 0: %v, every %d; expected the default, %d", err, sh.Config().Every, overlap.DefaultShadowEvery)
	}
}

// TestCompare checks Diff's ULPs against a count of the representable
// values between the two (math.Nextafter steps), and the rest by hand.
func TestCompare(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	steps32 := func(a, b float32) float64 {
		n := 0.0
		for a != b {
			a = math.Nextafter32(a, b)
			n++
		}
		return n
	}
	for range 200 {
		a := float32(rng.NormFloat64())
		b := a
		for range rng.IntN(40) {
			b = math.Nextafter32(b, float32(math.Inf(2*rng.IntN(2)-1)))
		}
		if rng.IntN(8) == 0 { // across zero
			a, b = float32(rng.IntN(5))*1e-45, -float32(rng.IntN(5))*1e-45
		}
		ga, _ := tensor.FromFloat32([]float32{1, a}, 2)
		gb, _ := tensor.FromFloat32([]float32{1, b}, 2)
		d, err := overlap.Compare(ga, gb)
		if err != nil {
			t.Fatal(err)
		}
		if want := steps32(a, b); d.ULP != want {
			t.Fatalf("%v vs %v: %v ULP, expected %v", a, b, d.ULP, want)
		}
		if a != b && (d.Index != 1 || float32(d.Got) != a || float32(d.Want) != b) {
			t.Fatalf("%v vs %v: at %d, %v and %v", a, b, d.Index, d.Got, d.Want)
		}
	}
	f64 := func(v ...float64) *tensor.Tensor { x, _ := tensor.FromFloat64(v, len(v)); return x }
	for _, tc := range []struct {
		got, want *tensor.Tensor
		rel, ulp  float64
	}{
		{f64(1, 2, -4), f64(1, 2, -4), 0, 0},
		{f64(0, 2, 0), f64(math.Copysign(0, -1), 2, 0), 0, 0},
		{f64(1, math.Nextafter(2, 3), -4), f64(1, 2, -4), (math.Nextafter(2, 3) - 2) / math.Sqrt(21), 1},
		{f64(1, 2.5, -4), f64(1, 2, -4), 0.5 / math.Sqrt(21), float64(1 << 50)},
		{f64(1e-3, 0), f64(0, 0), math.Inf(1), float64(math.Float64bits(1e-3))},
		{f64(math.NaN(), 2), f64(1, 2), math.Inf(1), math.Inf(1)},
	} {
		d, err := overlap.Compare(tc.got, tc.want)
		if err != nil {
			t.Fatal(err)
		}
		if d.Rel != tc.rel || d.ULP != tc.ulp {
			t.Errorf("%v vs %v: rel %v, %v ULP; expected %v, %v", tc.got.F64(), tc.want.F64(), d.Rel, d.ULP, tc.rel, tc.ulp)
		}
	}
	bf := func(v ...float32) *tensor.Tensor {
		x := tensor.MustHost(tensor.BFloat16, len(v))
		for i, f := range v {
			x.BF16()[i] = tensor.BF16FromFloat32(f)
		}
		return x
	}
	if d, _ := overlap.Compare(bf(1, 1.0078125), bf(1, 1)); d.ULP != 1 || d.Rel != 0.0078125/math.Sqrt(2) {
		t.Errorf("bf16 1+2⁻⁷ vs 1: %v ULP, rel %v; expected 1 ULP, rel 2⁻⁷/√2", d.ULP, d.Rel)
	}
	if _, err := overlap.Compare(f64(1), bf(1)); err == nil {
		t.Error("float64 against bf16: no error")
	}
}
