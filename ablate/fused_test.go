package ablate

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// fakeFused is collective under the name "fused": a fused strategy that
// runs on the CPU, for the plumbing of the fused cells.
type fakeFused struct{ overlap.Collective }

func (fakeFused) Name() string { return "fused" }

func near(got, want float64) bool { return math.Abs(got-want) <= 1e-9*math.Max(1, math.Abs(want)) }

// The fused cells' figures: the ceiling model with cuBLASLt's and the
// engine's GEMM time, the collective's time, and the fused table's row.
func TestFusedMetricsAndTable(t *testing.T) {
	c := Cell{Op: OpAllGatherMatmul, Dir: "fwd", Shape: Shape{Name: "mnk", M: 4096, N: 12288, K: 4096}, World: 4, Transport: "nvshmem", DType: "bf16"}
	at := func(s string, us float64) Result {
		c := c
		c.Strategy = s
		return Result{Cell: c, Status: StatusOK, MedianUS: us, Reps: 5, GemmUS: 100, CommUS: 60}
	}
	f := at(Fused, 110)
	f.EngineGemmUS = 105
	rs := []Result{at(Collective, 170), at(Pipelined, 130), f}
	Derive(rs, Stats{Alpha: DefaultAlpha, MinEffect: DefaultMinEffectGPU})
	m := rs[2].Metrics
	for _, x := range []struct {
		name      string
		got, want float64
	}{
		{"collective µs", m.CollectiveUS, 170},
		{"speedup", m.Speedup, 170.0 / 110},
		{"overlap eff.", m.OverlapEff, 1 - (110-100)/60.0},
		{"ceiling", m.Ceiling, 160.0 / 100},
		{"of ceiling", m.CeilingFrac, 170.0 / 110 / 1.6},
		{"engine overlap eff.", m.EngineOverlapEff, 1 - (110-105)/60.0},
		{"engine ceiling", m.EngineCeiling, 165.0 / 105},
		{"engine of ceiling", m.EngineCeilingFrac, 105.0 / 110},
	} {
		if !near(x.got, x.want) {
			t.Errorf("%s: %g, want %g", x.name, x.got, x.want)
		}
	}
	if e := rs[1].Metrics; e.EngineOverlapEff != 0 || !near(e.OverlapEff, 1-(130-100)/60.0) {
		t.Errorf("pipelined: engine eff. %g (want none), eff. %g (want the same model as fused)", e.EngineOverlapEff, e.OverlapEff)
	}
	r := Report{Results: rs}
	head, rows, note := r.FusedTable()
	if len(rows) != 1 || note != "" {
		t.Fatalf("%d rows, note %q; want one row (the fused cell) and no note", len(rows), note)
	}
	got := map[string]string{}
	for i, h := range head {
		got[h] = rows[0][i]
	}
	for h, want := range map[string]string{"fused µs": "110.0 (0.0–0.0)", "collective µs": "170.0", "pipelined µs": "130.0 (pipelined)",
		"GEMM alone µs cuBLASLt / engine": "100.0 / 105.0", "comm alone µs": "60.0", "overlap eff. cuBLASLt / engine": "0.83 / 0.92",
		"ceiling cuBLASLt / engine": "1.60 / 1.57", "of ceiling cuBLASLt / engine": "97 % / 95 %"} {
		if got[h] != want {
			t.Errorf("fused table %q: %q, want %q", h, got[h], want)
		}
	}
	rs[2].Status, rs[2].Reason = StatusNotRun, "fused …: refused"
	if _, rows, note := (&Report{Results: rs}).FusedTable(); len(rows) != 0 || !strings.Contains(note, "of 1 fused cells, 1 cannot run here") {
		t.Errorf("no timed fused cell: %d rows, note %q", len(rows), note)
	}
}

// A fused cell is verified against collective and timed, and the GEMMs of
// its group are also timed on the engine (Rank.Engine); an engine that
// refuses the op's GEMMs leaves a note instead. The real fused strategy
// on the CPU is not run, with its own reason.
func TestFusedCellsEngine(t *testing.T) {
	m := Matrix{Ops: []Op{OpAllGatherMatmul, OpMatmulReduceScatter}, Models: []string{"tiny"}, Ms: []int{64}, Worlds: []int{2},
		Transports: []string{"local"}, Strategies: []string{Collective, Fused}, DType: "f32", Warmup: 0, Reps: 2}
	cells := m.Cells()
	for _, c := range []struct {
		name     string
		strategy overlap.Strategy
		refuse   bool
	}{{"fake fused, engine", fakeFused{}, false}, {"fake fused, engine refuses", fakeFused{}, true}, {"strategies.Fused", strategies.Fused{}, false}} {
		var rs []Result
		calls := 0
		err := local.Run(2, func(g comm.Comm) error {
			b := cpu.New(cpu.WithThreads(1))
			eng := func(cc, a, bm *tensor.Tensor, tA, tB bool, alpha, beta float32) error {
				if c.refuse {
					return errors.New("not on this GPU")
				}
				if g.Rank() == 0 {
					calls++
				}
				b.MatMul(cc, a, bm, tA, tB, alpha, beta)
				return nil
			}
			r := &Rank{Group: g, Backend: b, Timer: WallTimer{Backend: b}, Strategies: map[string]overlap.Strategy{Collective: overlap.Collective{}, Fused: c.strategy},
				Seed: 1, Warmup: 0, Reps: 2, Engine: eng}
			out, err := r.Run(cells)
			if g.Rank() == 0 {
				rs = out
			}
			return err
		}, local.WithTimeout(30*time.Second))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(rs) != len(cells) {
			t.Fatalf("%s: %d results for %d cells", c.name, len(rs), len(cells))
		}
		for _, r := range rs {
			switch {
			case r.Strategy == Collective:
				if r.Status != StatusOK || r.EngineGemmUS != 0 {
					t.Errorf("%s: %s: %s %q, engine %g µs; want ok without an engine time", c.name, r.ID(), r.Status, r.Reason, r.EngineGemmUS)
				}
			case c.name == "strategies.Fused":
				if r.Status != StatusNotRun || !strings.Contains(r.Reason, "has no symmetric memory") || r.SpecK == 0 {
					t.Errorf("%s: %s: %s %q (spec K %d); want not run with the strategy's reason and the spec's widths", c.name, r.ID(), r.Status, r.Reason, r.SpecK)
				}
			case r.Status != StatusOK || r.Verified != "against collective on the same inputs":
				t.Errorf("%s: %s: %s %q", c.name, r.ID(), r.Status, r.Reason)
			case c.refuse && (r.EngineGemmUS != 0 || !strings.Contains(r.EngineNote, "the engine refuses this op's GEMMs: not on this GPU")):
				t.Errorf("%s: %s: engine %g µs, note %q; want no time and the refusal", c.name, r.ID(), r.EngineGemmUS, r.EngineNote)
			case !c.refuse && (r.EngineGemmUS <= 0 || r.EngineNote != ""):
				t.Errorf("%s: %s: engine %g µs, note %q; want a time", c.name, r.ID(), r.EngineGemmUS, r.EngineNote)
			}
		}
		// One engine call per product the fused strategy gives the engine
		// (fwd: 1, bwd: 1), a check and 2 reps, in 10 groups (the tiny
		// model's 3 entry and 2 exit sites, forward and backward).
		if !c.refuse && c.name != "strategies.Fused" && calls != 10*3 {
			t.Errorf("%s: %d engine calls on rank 0, want 30", c.name, calls)
		}
		if c.name == "strategies.Fused" && calls != 0 {
			t.Errorf("%s: %d engine calls, want none (no fused cell can run)", c.name, calls)
		}
	}
}

// --autotune with a fused strategy: a fused strategy that refuses the
// site is left out (collective or pipelined is picked, no error); one that
// runs is timed beside them.
func TestAutoTuneFused(t *testing.T) {
	for _, c := range []struct {
		name  string
		fused overlap.Strategy
		timed bool
	}{{"strategies.Fused on the CPU", strategies.Fused{}, false}, {"a fused that runs", fakeFused{}, true}, {"no fused", nil, false}} {
		var entries []Entry
		var choice string
		err := local.Run(2, func(g comm.Comm) error {
			b := cpu.New(cpu.WithThreads(1))
			a := &AutoTune{Lookup: Lookup{Path: "x.json", Transport: "local", GPU: "cpu", DType: "f32"}, World: g,
				Pipelined: strategies.Pipelined{}, Fused: c.fused, Seed: 1, Warmup: 0, Reps: 1}
			name, from, ok := a.Tuned(overlap.Spec{Kind: overlap.KindMatmulReduceScatter, Name: "blocks.0.attn.proj", Group: g, Backend: b,
				Rows: 64, K: 64, Outs: []int{128}, DType: tensor.Float32})
			if err := a.Err(); err != nil || !ok || !strings.Contains(from, "autotuned at start") {
				t.Errorf("%s: rank %d: %q from %q (%v): %v", c.name, g.Rank(), name, from, ok, err)
			}
			if g.Rank() == 0 {
				entries, choice = a.Measured().Entries, name
			}
			return nil
		}, local.WithTimeout(30*time.Second))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(entries) != 1 {
			t.Fatalf("%s: %d entries, want 1", c.name, len(entries))
		}
		e := entries[0]
		_, has := e.TimesUS["fused"]
		if has != c.timed || e.TimesUS["collective"] <= 0 || e.TimesUS["pipelined"] <= 0 || e.Strategy != choice {
			t.Errorf("%s: times %v, choice %s (the chooser got %s); want collective and pipelined timed, fused timed: %v", c.name, e.TimesUS, e.Strategy, choice, c.timed)
		}
	}
}
