package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/ablate"
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestMain makes the test binary a rank when cmd/ablate starts it as one
// (the tcp batches re-execute the running binary).
func TestMain(m *testing.M) {
	if os.Getenv(batchEnv) != "" {
		os.Exit(child())
	}
	if os.Getenv("ASYNCTP_ABLATE_MAIN") != "" { // the program itself, for its exit status
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// -help prints the flags and exits 0; a bad flag exits non-zero.
func TestHelpExitsZero(t *testing.T) {
	for _, c := range []struct {
		arg  string
		code int
		want string
	}{{"-help", 0, "-min-effect"}, {"--no-such-flag", 1, "flag provided but not defined"}} {
		cmd := exec.Command(os.Args[0], c.arg)
		cmd.Env = append(os.Environ(), "ASYNCTP_ABLATE_MAIN=1")
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || !strings.Contains(string(out), c.want) {
			t.Errorf("ablate %s: exit %d, want %d; output lacks %q:\n%s", c.arg, code, c.code, c.want, out)
		}
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func readReport(t *testing.T, dir string) ablate.Report {
	t.Helper()
	js, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r ablate.Report
	if err := json.Unmarshal(js, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// The quick matrix writes a complete report: the answer first, every file,
// every cell of the matrix (none dropped), every timed cell verified within
// its tolerance, the cells that cannot run here with why; with too few
// rounds for the level nothing is called significant and the report says
// so; world 1 shows the machinery's cost, no speedup and no cache entry;
// the autotune cache round-trips and drives "auto".
func TestQuickReport(t *testing.T) {
	out := t.TempDir()
	args := []string{"--preset", "quick", "--reps", "3", "--warmup", "1", "--out", out, "--progress", "lines", "--torch", "off"}
	if err := run(context.Background(), args, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	for _, f := range append(append([]string(nil), ablate.Files...), "speedup.png", "breakdown.png", "bandwidth.png", "layers.png", "autotune.json", "ablate.log") {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v (want a non-empty file)", f, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(out, "report.md"))
	html, _ := os.ReadFile(filepath.Join(out, "report.html"))
	if i, j := strings.Index(string(md), "## The answer"), strings.Index(string(md), "## Every timed cell"); i < 0 || j < i {
		t.Errorf("report.md: the answer at %d, the full table at %d; want the answer first", i, j)
	}
	for _, want := range []string{"| all-gather-matmul | 2 | local | f32 | collective: no significant difference |", "| matmul-all-reduce | 1 | local | f32 | collective (nothing to exchange) | ",
		"With 3 rounds no comparison can be significant at this level: use --reps", "## Every timed cell", "## The fused cells",
		"No fused cell was timed in this run: of 108 fused cells, 108 cannot run here",
		"## Cells that cannot run here", "## Environment", "has no symmetric memory", "![speedup vs M per strategy](speedup.png)", "| AG+MM fwd |",
		`| fused for all-gather-matmul site "ablate.all-gather-matmul": group world[0 1] has no symmetric memory: it needs symmetric memory with peer pointers (comm.SymmetricMemory: NVSHMEM's, alone or beside NCCL's collectives) (strategy unavailable) |`} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	if n := strings.Count(string(html), `src="data:image/png;base64,`); n != 4 {
		t.Errorf("report.html inlines %d charts, want 4", n)
	}
	rep := readReport(t, out)
	m, _, err := parse(args)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != len(m.Cells()) {
		t.Fatalf("%d results for %d cells", len(rep.Results), len(m.Cells()))
	}
	// One answer per op (the layer cells: per sequence parallelism) and
	// world; world 1's say collective with the machinery's cost.
	if len(rep.Answers) != 3*(4+4) {
		t.Errorf("%d answers, want 24 (4 ops and 4 layer cells at 3 worlds)", len(rep.Answers))
	}
	for _, a := range rep.Answers {
		if a.Use != ablate.Collective || a.Significant {
			t.Errorf("answer %+v: want collective, not significant (3 rounds cannot be)", a)
		}
		for _, v := range a.Vs {
			if v.Interval.Determined() || v.Interval.Verdict != ablate.NoDiff || v.Cells == 0 {
				t.Errorf("answer %s P=%d: %s %+v; want no interval at 3 rounds", a.Op, a.World, v.Strategy, v)
			}
		}
	}
	timed, fused := 0, 0
	for _, r := range rep.Results {
		if r.Strategy == ablate.Fused {
			// Every fused cell is listed, none timed on the CPU, each with
			// the fused strategy's own refusal (strategies.Fused.Supports).
			fused++
			want := "has no symmetric memory: it needs symmetric memory with peer pointers (comm.SymmetricMemory: NVSHMEM's, alone or beside NCCL's collectives)"
			if r.Op == ablate.OpMatmulAllReduce || r.Dir == "nosp" {
				want = "the matmul∘all-reduce sites have no fused form"
			}
			if r.Status != ablate.StatusNotRun || !strings.HasPrefix(r.Reason, "fused ") || !strings.Contains(r.Reason, want) ||
				!strings.Contains(r.Reason, overlap.ErrUnavailable.Error()) {
				t.Errorf("%s: %s %q; want not run, the fused strategy's refusal saying %q", r.ID(), r.Status, r.Reason, want)
			}
		}
		switch r.Status {
		case ablate.StatusOK:
			timed++
			if len(r.TimesUS) != 3 || r.MedianUS != median(r.TimesUS) {
				t.Errorf("%s: rounds %v, median %g; want 3 rounds and their median", r.ID(), r.TimesUS, r.MedianUS)
			}
			switch {
			case r.World == 1 && (r.Speedup != 0 || r.Ceiling != 0):
				t.Errorf("%s: world 1 with speedup %g, ceiling %g; want none (nothing to exchange)", r.ID(), r.Speedup, r.Ceiling)
			case r.Strategy != ablate.Collective && (r.VsCollective == nil || r.VsCollective.Rounds != 3):
				t.Errorf("%s: comparison with collective %+v, want one over 3 rounds", r.ID(), r.VsCollective)
			}
			// results.json says what carried each cell's group.
			if want := "over " + r.Transport; !strings.HasSuffix(r.Via, want) || (r.Strategy == ablate.Collective) != strings.HasPrefix(r.Via, "the group's collectives") {
				t.Errorf("%s: via %q, want what carried the %s cell, ending %q", r.ID(), r.Via, r.Strategy, want)
			}
			if r.Verified == "" || !(r.RelErr <= r.Tol) || r.MedianUS <= 0 || r.Reps != 3 {
				t.Errorf("%s: timed but verified %q, rel. err %g (tol %g), %g µs over %d reps", r.ID(), r.Verified, r.RelErr, r.Tol, r.MedianUS, r.Reps)
			}
			if r.Strategy != ablate.Collective && r.Verified != "against collective on the same inputs" {
				t.Errorf("%s: verified %q, want against collective", r.ID(), r.Verified)
			}
			if r.Strategy == ablate.Collective && r.Op.IsLayer() && !strings.Contains(r.Verified, "against the unsharded layers") {
				t.Errorf("%s: verified %q, want against the unsharded layers", r.ID(), r.Verified)
			}
		case ablate.StatusNotRun:
			if r.Reason == "" {
				t.Errorf("%s: not run without a reason", r.ID())
			}
		default:
			t.Errorf("%s: %s: %s", r.ID(), r.Status, r.Reason)
		}
	}
	// The tiny model's sites: 15 op groups (3 entries × fwd, bwd; 2 exits
	// × fwd, bwd; matmul-all-reduce's 5: the entries' backward, the exits'
	// forward), each collective and pipelined, at 2 M and 3 worlds; the MoE
	// op's collective at 2 M and 3 worlds; collective and pipelined of the
	// 4 layer cells (the block with and without SP, the MoE block, the
	// step) at 1 M and 3 worlds.
	if want := 2*15*2*3 + 2*3 + 2*4*3; timed != want {
		t.Errorf("%d cells timed, want %d", timed, want)
	}
	// 15 op groups and the MoE op at 2 M, the 4 layer cells at 1 M, at 3
	// worlds.
	if want := (16*2 + 4) * 3; fused != want {
		t.Errorf("%d fused cells in the report, want %d", fused, want)
	}

	// The cache: round-trip, and "auto" picks from it.
	c, exists, err := ablate.LoadCache(filepath.Join(out, "autotune.json"))
	if err != nil || !exists || len(c.Entries) != 10*2*2 {
		t.Fatalf("cache: %d entries, exists %v, %v; want 40 (10 site shapes × 2 M × worlds 2 and 4)", len(c.Entries), exists, err)
	}
	for _, e := range c.Entries {
		if e.World < 2 || e.Strategy != ablate.Collective || e.Significant || len(e.VsCollective) != 1 {
			t.Errorf("cache entry %+v: want world ≥ 2, collective, not significant (3 rounds), pipelined compared", e)
		}
	}
	if len(rep.Tuned) != len(c.Entries) {
		t.Errorf("report lists %d tuned entries, the cache has %d", len(rep.Tuned), len(c.Entries))
	}
	var e ablate.Entry
	for _, x := range c.Entries {
		if x.World == 2 && x.Kind == overlap.KindMatmulReduceScatter && x.Transport == "local" {
			e = x
		}
	}
	err = local.Run(2, func(g comm.Comm) error {
		l := ablate.Lookup{Cache: c, Path: "cache.json", Transport: "local", GPU: "cpu"}
		ch, err := overlap.NewChooser(overlap.Config{Default: "auto"}, []overlap.Strategy{strategies.Pipelined{}}, nil, overlap.WithTuning(l))
		if err != nil {
			return err
		}
		s, err := ch.Choose(overlap.Spec{Kind: e.Kind, Name: "x", Group: g, Backend: cpu.New(), Rows: e.M, K: e.K, Outs: []int{e.Outs}, DType: tensor.Float32})
		if err != nil {
			return err
		}
		if s.Name() != e.Strategy {
			t.Errorf("auto chose %s, the cache says %s", s.Name(), e.Strategy)
		}
		if sum := strings.Join(ch.Summary(), "\n"); !strings.Contains(sum, "auto: autotune cache cache.json") {
			t.Errorf("summary does not say the choice came from the cache:\n%s", sum)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// broken is collective with an all-gather∘matmul forward that is off by
// 1e-3 (relative): a strategy that passes every other site.
type broken struct{ overlap.Collective }

func (broken) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	s, err := overlap.Collective{}.NewAllGatherMatmul(sp)
	return brokenAGMM{s, sp.Backend}, err
}

type brokenAGMM struct {
	overlap.AllGatherMatmul
	b tensor.Backend
}

func (s brokenAGMM) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	if err := s.AllGatherMatmul.Forward(outs, xFull, x, ws); err != nil {
		return err
	}
	s.b.Scale(outs[0], outs[0], 1.001)
	return nil
}

// A wrong strategy is reported as wrong and not timed, in its op and in
// the block with sequence parallelism (whose entries are all-gather-matmul
// sites); its correct directions are timed; the cache never picks it where
// it is wrong.
func TestWrongStrategyReported(t *testing.T) {
	out := t.TempDir()
	args := []string{"--preset", "quick", "--ops", "all-gather-matmul,tp-block", "--worlds", "2", "--transports", "local", "--m", "64,128", "--strategies", "collective,pipelined",
		"--reps", "2", "--warmup", "0", "--out", out, "--progress", "off", "--torch", "off"}
	st := map[string]overlap.Strategy{ablate.Collective: overlap.Collective{}, ablate.Pipelined: broken{}}
	if err := run(context.Background(), args, io.Discard, st); err != nil {
		t.Fatal(err)
	}
	rep := readReport(t, out)
	wrong := 0
	for _, r := range rep.Results {
		bad := r.Strategy == ablate.Pipelined && (r.Op == ablate.OpAllGatherMatmul && r.Dir == "fwd" || r.Op == ablate.OpTPBlock && r.Dir == "sp")
		switch {
		case bad && (r.Status != ablate.StatusWrong || r.MedianUS != 0 || !strings.Contains(r.Reason, "relative error")):
			t.Errorf("%s: %s %q, %g µs; want wrong, not timed", r.ID(), r.Status, r.Reason, r.MedianUS)
		case bad:
			wrong++
		case r.Status != ablate.StatusOK:
			t.Errorf("%s: %s %q; want ok", r.ID(), r.Status, r.Reason)
		}
	}
	if wrong != 8 {
		t.Errorf("%d wrong cells, want 8 (the forward of 3 sites at 2 M, the block with SP at 2 M)", wrong)
	}
	md, _ := os.ReadFile(filepath.Join(out, "report.md"))
	if !strings.Contains(string(md), "| wrong | AG+MM fwd |") {
		t.Errorf("report.md does not list the wrong cells")
	}
	for _, e := range rep.Tuned {
		if e.Strategy != ablate.Collective {
			t.Errorf("cache entry %+v picks %s, which was wrong in one direction", e, e.Strategy)
		}
	}
}

// tcp cells: every rank a child process (this test binary, see TestMain)
// over comm/tcp; the TP op, the block and the MoE op verify and time.
func TestTCPCells(t *testing.T) {
	out := t.TempDir()
	args := []string{"--ops", "all-gather-matmul,tp-block,moe-dispatch-combine", "--worlds", "2", "--transports", "tcp", "--m", "64",
		"--strategies", "collective,pipelined,fused", "--reps", "2", "--warmup", "0", "--out", out, "--progress", "off", "--torch", "off"}
	if err := run(context.Background(), args, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	rep := readReport(t, out)
	ok, fused := 0, 0
	for _, r := range rep.Results {
		switch {
		case r.Transport != "tcp":
			t.Errorf("%s: transport %s, want tcp", r.ID(), r.Transport)
		case r.Status == ablate.StatusOK && r.RelErr <= r.Tol && r.MedianUS > 0:
			ok++
		case r.Op == ablate.OpMoEDispatchCombine && r.Strategy == ablate.Pipelined && r.Status == ablate.StatusNotRun:
		case r.Strategy == ablate.Fused && r.Status == ablate.StatusNotRun && strings.HasPrefix(r.Reason, "fused "):
			fused++ // the tcp ranks have the fused strategy, which refuses the CPU
		default:
			t.Errorf("%s: %s %q (rel. err %g)", r.ID(), r.Status, r.Reason, r.RelErr)
		}
	}
	// all-gather-matmul fwd, bwd of 3 sites and the block sp, nosp, two
	// strategies each; the MoE op's collective.
	if ok != 17 || fused != 9 {
		t.Errorf("%d cells verified and timed, want 17; %d fused cells refused by the strategy, want 9", ok, fused)
	}
}

// Flags given explicitly are used as given or refused.
func TestFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--preset", "big"}, `--preset "big": expected quick or gpu`},
		{[]string{"--transports", "mpi"}, `transport "mpi": expected one of local, tcp, nccl, nvshmem`},
		{[]string{"--models", "gpt5"}, `shape preset "gpt5"`},
		{[]string{"--mnk", "1,2"}, `shape "1,2": expected M,N,K`},
		{[]string{"--reps", "0"}, "expected reps ≥ 1"},
		{[]string{"--alpha", "0"}, "alpha 0: expected a family-wise error rate in (0, 1)"},
		{[]string{"--min-effect", "1.5"}, "minimum effect 1.5: expected a fraction in [0, 1)"},
	} {
		if _, _, err := parse(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
	}
}

// --fused-transfer: used as given for the fused cells (into the report's
// environment), refused when unknown or when the matrix has no fused
// cells; unset, $ASYNCTP_FUSED_TRANSFER decides (checked).
func TestFusedTransferFlag(t *testing.T) {
	t.Setenv(peercopy.TransferEnv, "")
	for args, want := range map[string]string{"": "pull", "--fused-transfer pull": "pull", "--fused-transfer put": "put"} {
		_, o, err := parse(strings.Fields(args))
		if err != nil || o.fusedTransfer != want {
			t.Errorf("%q: transfer %q, %v; want %q", args, o.fusedTransfer, err, want)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fused-transfer", "push"}, `--fused-transfer: fused transfer "push": expected one of pull, put`},
		{[]string{"--strategies", "collective,pipelined", "--fused-transfer", "put"}, "--fused-transfer put: the matrix has no fused cells"},
	} {
		if _, _, err := parse(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
	}
	t.Setenv(peercopy.TransferEnv, "put")
	if _, o, err := parse(nil); err != nil || o.fusedTransfer != "put" {
		t.Errorf("$%s=put: transfer %q, %v; want put", peercopy.TransferEnv, o.fusedTransfer, err)
	}
	t.Setenv(peercopy.TransferEnv, "fast")
	if _, _, err := parse(nil); err == nil || !strings.Contains(err.Error(), "$"+peercopy.TransferEnv) {
		t.Errorf("$%s=fast: %v, want an error naming the variable", peercopy.TransferEnv, err)
	}
}

// named is base under another name: the same sites, so the same speed.
type named struct {
	overlap.Strategy
	name string
}

func (n named) Name() string { return n.name }

// slowed is base under name whose sites wait, after each call, three times
// as long as the call took and a millisecond more: over four times as
// slow, with the same outputs, and slower by more than the stalls a loaded
// machine's scheduler puts into a call of the other strategy.
type slowed struct{ named }

func slowly(start time.Time) { time.Sleep(3*time.Since(start) + time.Millisecond) }

func (s slowed) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	site, err := s.Strategy.NewAllGatherMatmul(sp)
	return slowAGMM{site}, err
}

func (s slowed) NewMatmulReduceScatter(sp overlap.Spec) (overlap.MatmulReduceScatter, error) {
	site, err := s.Strategy.NewMatmulReduceScatter(sp)
	return slowMMRS{site}, err
}

func (s slowed) NewMatmulAllReduce(sp overlap.Spec) (overlap.MatmulAllReduce, error) {
	site, err := s.Strategy.NewMatmulAllReduce(sp)
	return slowMMAR{site}, err
}

type slowAGMM struct{ overlap.AllGatherMatmul }

func (s slowAGMM) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	defer slowly(time.Now())
	return s.AllGatherMatmul.Forward(outs, xFull, x, ws)
}

func (s slowAGMM) Backward(dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (comm.Work, error) {
	defer slowly(time.Now())
	return s.AllGatherMatmul.Backward(dx, dws, douts, xFull, ws)
}

type slowMMRS struct{ overlap.MatmulReduceScatter }

func (s slowMMRS) Forward(out, x, w *tensor.Tensor) error {
	defer slowly(time.Now())
	return s.MatmulReduceScatter.Forward(out, x, w)
}

func (s slowMMRS) Backward(dx, dw, dout, x, w *tensor.Tensor) (comm.Work, error) {
	defer slowly(time.Now())
	return s.MatmulReduceScatter.Backward(dx, dw, dout, x, w)
}

type slowMMAR struct{ overlap.MatmulAllReduce }

func (s slowMMAR) Run(out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) (comm.Work, error) {
	defer slowly(time.Now())
	return s.MatmulAllReduce.Run(out, as, ws, transW)
}

// A strategy four times slower than collective is called slower beyond
// the noise in every cell, and collective is the cache's significant
// choice; a collective four times slower than the other strategy makes
// that one the significant choice; the same strategy under two names
// differs significantly nowhere. The matrix's rounds are enough for its
// level (else nothing could be significant and the test could not fail),
// and enough that a few rounds a loaded machine stalls change nothing.
func TestSignificance(t *testing.T) {
	args := []string{"--preset", "quick", "--ops", "all-gather-matmul,matmul-all-reduce", "--worlds", "1,2", "--mnk", "256,128,64", "--strategies", "collective,pipelined",
		"--reps", "30", "--warmup", "1", "--progress", "off", "--torch", "off"}
	coll := overlap.Collective{}
	for _, c := range []struct {
		name       string
		collective overlap.Strategy
		pipelined  overlap.Strategy
		verdict    string // every pipelined cell's
		choice     string // every cache entry's (significant unless no difference)
	}{
		{"pipelined 4× slower", coll, slowed{named{coll, ablate.Pipelined}}, ablate.Slower, ablate.Collective},
		{"collective 4× slower", slowed{named{coll, ablate.Collective}}, named{coll, ablate.Pipelined}, ablate.Faster, ablate.Pipelined},
		{"the same strategy twice", coll, named{coll, ablate.Pipelined}, ablate.NoDiff, ablate.Collective},
	} {
		out := t.TempDir()
		st := map[string]overlap.Strategy{ablate.Collective: c.collective, ablate.Pipelined: c.pipelined}
		if err := run(context.Background(), append(args, "--out", out), io.Discard, st); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		rep := readReport(t, out)
		if need := ablate.MinRounds(rep.Stats.Alpha, rep.Stats.Comparisons); need > rep.Matrix.Reps {
			t.Fatalf("%s: %d rounds, %d comparisons: at least %d rounds are needed for significance", c.name, rep.Matrix.Reps, rep.Stats.Comparisons, need)
		}
		n := 0
		for _, r := range rep.Results {
			if r.Strategy != ablate.Pipelined {
				continue
			}
			n++
			if r.VsCollective == nil || r.VsCollective.Verdict != c.verdict {
				t.Errorf("%s: %s: %s %q, against collective %+v; want %s", c.name, r.ID(), r.Status, r.Reason, r.VsCollective, c.verdict)
			}
		}
		if n != 2*(2+1) {
			t.Errorf("%s: %d pipelined cells, want 6 (all-gather-matmul forward and backward, matmul-all-reduce, at 2 worlds)", c.name, n)
		}
		if len(rep.Tuned) != 2 {
			t.Errorf("%s: %d cache entries, want 2 (world 2 only)", c.name, len(rep.Tuned))
		}
		for _, e := range rep.Tuned {
			if e.Strategy != c.choice || e.Significant != (c.verdict != ablate.NoDiff) || e.World != 2 {
				t.Errorf("%s: cache entry %s %s: %s, significant %v (%s); want %s, significant %v", c.name, e.Kind, e.Shape, e.Strategy, e.Significant, e.Basis,
					c.choice, c.verdict != ablate.NoDiff)
			}
		}
		for _, a := range rep.Answers {
			if len(a.Vs) != 1 || a.Vs[0].Interval.Verdict != c.verdict {
				t.Errorf("%s: answer %s P=%d: %+v; want pipelined %s", c.name, a.Op, a.World, a.Vs, c.verdict)
			}
			if want := c.choice; a.World == 1 && a.Use != ablate.Collective || a.World > 1 && a.Use != want {
				t.Errorf("%s: answer %s P=%d uses %s; want %s (world 1: collective)", c.name, a.Op, a.World, a.Use, want)
			}
		}
	}
}

// Two back-to-back runs of the quick preset's sites (the TP ops of the tiny
// models at one M, worlds 2 and 4: the cache's real cells, with rounds
// enough for significance) have the same cache entries, and no choice,
// cell verdict or answer that one run makes significant is contradicted
// or absent in the other: the strategy it chose was compared there too,
// the other run chose no other one significantly, and its interval does
// not exclude the effect claimed (for "faster": it reaches below
// 1/(1 + min effect); for "slower": above 1 + min effect), which the
// statistics bound (ablate.Stats: at most 2·alpha, under the same
// conditions). Every verdict of both runs is replicated in both halves of
// its rounds. A choice one run makes and the other leaves not significant
// is allowed (an effect near the minimum effect), and logged.
func TestBackToBackAgree(t *testing.T) {
	args := []string{"--preset", "quick", "--ops", "all-gather-matmul,matmul-reduce-scatter,matmul-all-reduce", "--worlds", "2,4", "--m", "256",
		"--reps", "20", "--warmup", "2", "--progress", "off", "--torch", "off"}
	var reps [2]ablate.Report
	for i := range reps {
		out := t.TempDir()
		if err := run(context.Background(), append(args, "--out", out), io.Discard, nil); err != nil {
			t.Fatal(err)
		}
		reps[i] = readReport(t, out)
		if need := ablate.MinRounds(reps[i].Stats.Alpha, reps[i].Stats.Comparisons); need > reps[i].Matrix.Reps {
			t.Fatalf("run %d: %d comparisons need %d rounds for significance, the test has %d", i, reps[i].Stats.Comparisons, need, reps[i].Matrix.Reps)
		}
	}
	eps := reps[0].Stats.MinEffect
	// contradicts says whether the interval b of one run excludes what
	// verdict v of the other claims.
	contradicts := func(v string, b ablate.Interval) bool {
		switch v {
		case ablate.Faster:
			return b.Determined() && b.Lo >= 1/(1+eps)
		case ablate.Slower:
			return b.Determined() && b.Hi <= 1+eps
		}
		return false
	}
	replicated := func(what string, iv ablate.Interval) {
		if iv.Verdict == ablate.NoDiff {
			return
		}
		if len(iv.Halves) != 2 || iv.Verdict == ablate.Faster && !(iv.Halves[0].Hi < 1 && iv.Halves[1].Hi < 1) ||
			iv.Verdict == ablate.Slower && !(iv.Halves[0].Lo > 1 && iv.Halves[1].Lo > 1) {
			t.Errorf("%s: %s without both halves of its rounds on that side of 1: %+v", what, iv.Verdict, iv)
		}
	}
	key := func(e ablate.Entry) string { return fmt.Sprint(e.Kind, " ", e.Shape, " P=", e.World) }
	var entries [2]map[string]ablate.Entry
	for i := range reps {
		entries[i] = map[string]ablate.Entry{}
		for _, e := range reps[i].Tuned {
			entries[i][key(e)] = e
			for n, iv := range e.VsCollective {
				replicated(fmt.Sprintf("run %d: cache entry %s: %s", i+1, key(e), n), iv)
			}
		}
	}
	both, one := 0, 0
	for i := range reps {
		for k, a := range entries[i] {
			b, ok := entries[1-i][k]
			if !ok {
				t.Errorf("cache entry %s only in run %d", k, i+1)
				continue
			}
			if !a.Significant {
				continue
			}
			switch {
			case b.Significant && b.Strategy != a.Strategy:
				t.Errorf("%s: run %d chose %s (%s), run %d %s (%s): both significant", k, i+1, a.Strategy, a.Basis, 2-i, b.Strategy, b.Basis)
			case b.Significant:
				if i == 0 {
					both++
				}
			default:
				one++
				t.Logf("%s: run %d chose %s significantly (%s), run %d found no significant difference (%s)", k, i+1, a.Strategy, a.Basis, 2-i, b.Basis)
			}
			for n, iv := range a.VsCollective {
				if a.Strategy != ablate.Collective && n != a.Strategy {
					continue // the claim is about the strategy chosen
				}
				biv, ok := b.VsCollective[n]
				if !ok {
					t.Errorf("%s: run %d's significant choice rests on %s, which run %d did not compare", k, i+1, n, 2-i)
				} else if contradicts(iv.Verdict, biv) {
					t.Errorf("%s: %s %s in run %d (%s), contradicted in run %d: %s", k, n, iv.Verdict, i+1, iv.SpeedupText(), 2-i, biv.SpeedupText())
				}
			}
		}
	}
	var cells [2]map[string]*ablate.Interval
	for i := range reps {
		cells[i] = map[string]*ablate.Interval{}
		for _, r := range reps[i].Results {
			if r.VsCollective != nil {
				cells[i][r.ID()] = r.VsCollective
				replicated(fmt.Sprintf("run %d: cell %s", i+1, r.ID()), *r.VsCollective)
			}
		}
	}
	for i := range reps {
		for id, a := range cells[i] {
			if b, ok := cells[1-i][id]; ok && contradicts(a.Verdict, *b) {
				t.Errorf("cell %s: %s in run %d (%s), contradicted in run %d (%s, %s)", id, a.Verdict, i+1, a.SpeedupText(), 2-i, b.SpeedupText(), b.Verdict)
			}
		}
	}
	answers := [2]map[string]ablate.Answer{{}, {}}
	for i := range reps {
		for _, a := range reps[i].Answers {
			answers[i][fmt.Sprint(a.Op, a.Dir, a.World, a.Transport, a.DType)] = a
		}
	}
	for i := range reps {
		for k, a := range answers[i] {
			b, ok := answers[1-i][k]
			if !ok {
				t.Errorf("answer %s P=%d only in run %d", a.Op, a.World, i+1)
				continue
			}
			if a.Significant && b.Significant && a.Use != b.Use {
				t.Errorf("answer %s P=%d: %s (%s) in run %d, %s (%s) in run %d", a.Op, a.World, a.Use, a.Basis, i+1, b.Use, b.Basis, 2-i)
			}
			for _, v := range a.Vs {
				replicated(fmt.Sprintf("run %d: answer %s P=%d: %s", i+1, a.Op, a.World, v.Strategy), v.Interval)
				for _, w := range b.Vs {
					if w.Strategy == v.Strategy && contradicts(v.Interval.Verdict, w.Interval) {
						t.Errorf("answer %s P=%d: %s %s in run %d (%s), contradicted in run %d (%s)", a.Op, a.World, v.Strategy, v.Interval.Verdict, i+1,
							v.Interval.SpeedupText(), 2-i, w.Interval.SpeedupText())
					}
				}
			}
		}
	}
	t.Logf("%d cache entries, %d of them significant in both runs, %d in one only", len(reps[1].Tuned), both, one)
}
