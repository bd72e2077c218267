package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	os.Exit(m.Run())
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

// The quick matrix writes a complete report: every file, every cell of the
// matrix (none dropped), every timed cell verified within its tolerance,
// the cells that cannot run here with why; the autotune cache round-trips
// and drives "auto".
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
	for _, want := range []string{"## Headline", "## Every timed cell", "## The fused cells", "No fused cell was timed in this run: of 66 fused cells, 66 cannot run here",
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
	// collective and pipelined of 5 op directions at 3 M and 3 worlds, the
	// MoE op's collective at 3 M and 3 worlds, and collective and pipelined
	// of the 4 layer cells (the block with and without SP, the MoE block,
	// the step) at 1 M and 3 worlds.
	if want := 2*5*3*3 + 3*3 + 2*4*3; timed != want {
		t.Errorf("%d cells timed, want %d", timed, want)
	}
	// 5 op directions and the MoE op at 3 M, the 4 layer cells at 1 M, at
	// 3 worlds.
	if want := (6*3 + 4) * 3; fused != want {
		t.Errorf("%d fused cells in the report, want %d", fused, want)
	}

	// The cache: round-trip, and "auto" picks from it.
	c, exists, err := ablate.LoadCache(filepath.Join(out, "autotune.json"))
	if err != nil || !exists || len(c.Entries) != 3*3*3 {
		t.Fatalf("cache: %d entries, exists %v, %v; want 27 (3 site kinds × 3 M × 3 worlds)", len(c.Entries), exists, err)
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
	if wrong != 4 {
		t.Errorf("%d wrong cells, want 4 (the forward at 2 M, the block with SP at 2 M)", wrong)
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
	// all-gather-matmul fwd, bwd and the block sp, nosp, two strategies
	// each; the MoE op's collective.
	if ok != 9 || fused != 5 {
		t.Errorf("%d cells verified and timed, want 9; %d fused cells refused by the strategy, want 5", ok, fused)
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
