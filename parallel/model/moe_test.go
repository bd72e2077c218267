package model_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
)

// moeConfig is the MoE model of the tests: smallConfig with 8 experts,
// top-2, in every block, and aux and z losses strong enough to matter in
// the gradients.
func moeConfig() layers.GPTConfig {
	c := smallConfig()
	c.FFN = 32
	c.Experts, c.TopK, c.MoEEvery = 8, 2, 1
	c.AuxLossCoef, c.ZLossCoef = 0.1, 0.01
	return c
}

// moeScenario is one routing regime of the MoE equivalence test.
type moeScenario struct {
	name  string
	cfg   layers.GPTConfig
	tweak tweakFunc
	// starved experts must receive no token; with EP ≥ 2 the EP ranks
	// holding only them must receive no row.
	starved []int
	drops   bool // the capacity must drop slots
}

// starvedRanks are the EP ranks (of an EP group of P) whose experts are all
// starved.
func (sc moeScenario) starvedRanks(P int) []int {
	per := sc.cfg.Experts / P
	var out []int
	for r := range P {
		all := true
		for e := r * per; e < (r+1)*per; e++ {
			all = all && slices.Contains(sc.starved, e)
		}
		if all && len(sc.starved) > 0 {
			out = append(out, r)
		}
	}
	return out
}

// rankOneRouter sets every MoE router weight to W[e] = s[e]·u for one random
// direction u: a token goes to the two experts of largest s when x·u > 0
// and to the two of smallest s otherwise, so experts 4..7 (s near 0) never
// receive a token.
func rankOneRouter(b tensor.Backend, ps *layers.ParamSet) error {
	s := []float64{3, 2.5, -2.5, -3, 0.1, 0.05, -0.05, -0.1}
	for _, p := range ps.Params() {
		if !strings.HasSuffix(p.Name, ".moe.router.weight") {
			continue
		}
		E, C := p.Shape()[0], p.Shape()[1]
		if E != len(s) {
			return fmt.Errorf("rankOneRouter: %s has %d experts, want %d", p.Name, E, len(s))
		}
		u := testutil.RandFloats(testutil.Rng(7), C, 0.05, 0.2)
		vals := make([]float64, E*C)
		for e := range E {
			for c := range C {
				vals[e*C+c] = s[e] * u[c]
			}
		}
		h, err := tensor.FromFloat64(vals, E, C)
		if err != nil {
			return err
		}
		b.Upload(p.W, h)
	}
	return b.Err()
}

func moeScenarios() []moeScenario {
	uneven := moeConfig()
	starved := moeConfig()
	starved.MoEEvery = 2 // block 0 dense, block 1 MoE
	capped := moeConfig()
	capped.CapacityFactor = 1
	return []moeScenario{
		{name: "uneven", cfg: uneven},
		{name: "starved", cfg: starved, tweak: rankOneRouter, starved: []int{4, 5, 6, 7}},
		{name: "capacity", cfg: capped, drops: true},
	}
}

// moeLayouts are every layout with TP ∈ {1, 2, 4}, DP ∈ {1, 2},
// EP ∈ {1, 2, 4} dividing DP × TP, and sequence parallelism on and off
// (TP > 1).
func moeLayouts() []layout {
	var ls []layout
	for _, tpn := range []int{1, 2, 4} {
		for _, dp := range []int{1, 2} {
			for _, epn := range []int{1, 2, 4} {
				if (tpn*dp)%epn != 0 {
					continue
				}
				for _, sp := range []bool{false, true} {
					if sp && tpn == 1 {
						continue
					}
					ls = append(ls, layout{tp: tpn, dp: dp, ep: epn, sp: sp})
					if tpn > 1 && dp == 1 {
						ls = append(ls, layout{tp: tpn, dp: dp, ep: epn, sp: sp, overlap: "pipelined"})
					}
				}
			}
		}
	}
	return ls
}

// TestMoEModelMatchesGPT is the MoE acceptance test: for every layout of
// moeLayouts (TP 1, 2, 4 × DP 1, 2 × EP 1, 2, 4 where EP divides the world,
// sequence parallelism on and off) and three routing regimes — uneven
// routing, experts and whole EP ranks that receive no token, and a
// capacity that drops slots — the sharded MoE model's loss (with the aux
// losses), logits, aux loss, router statistics, every gradient and the
// gradient norm equal those of layers.GPT on the same global batch within
// 1e-5 (f32).
func TestMoEModelMatchesGPT(t *testing.T) {
	const B, T, tol = 4, 8, 1e-5
	for _, sc := range moeScenarios() {
		ids, targets := batch(3, B, T, sc.cfg.Vocab)
		ref := runReferenceWith(t, sc.cfg, tensor.Float32, ids, targets, sc.tweak)
		if len(ref.stats) == 0 || ref.aux == 0 {
			t.Fatalf("%s: reference has %d MoE blocks and aux loss %v", sc.name, len(ref.stats), ref.aux)
		}
		dropped := 0
		for _, st := range ref.stats {
			dropped += st.Dropped
			for _, e := range sc.starved {
				if st.TokensPerExpert[e] != 0 {
					t.Fatalf("%s: starved expert %d got %d slots: %v", sc.name, e, st.TokensPerExpert[e], st.TokensPerExpert)
				}
			}
		}
		if sc.drops != (dropped > 0) {
			t.Fatalf("%s: the reference dropped %d slots", sc.name, dropped)
		}
		t.Logf("%s: reference tokens per expert %v, dropped %d, aux %.5g", sc.name, tokensPerExpert(ref.stats), dropped, ref.aux)
		var worst worstErr
		for _, l := range moeLayouts() {
			t.Run(sc.name+"/"+l.String(), func(t *testing.T) {
				err := onGrid(l, func(b tensor.Backend, g *comm.Grid) error {
					return checkAgainst(b, g, sc.cfg, l, tensor.Float32, ids, targets, ref, tol, &worst, checkHooks{
						tweak: sc.tweak,
						after: func(m *model.Model) error { return checkRouting(m, g, sc, ref, tol, &worst) },
					})
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		}
		t.Logf("%s: worst relative errors %v", sc.name, worst.m)
	}
}

func tokensPerExpert(st []layers.MoEStats) [][]int {
	var out [][]int
	for _, s := range st {
		out = append(out, s.TokensPerExpert)
	}
	return out
}

// checkRouting compares a rank's aux loss and router statistics with the
// reference's and checks that the ranks holding only starved experts
// received no row.
func checkRouting(m *model.Model, g *comm.Grid, sc moeScenario, ref reference, tol float64, worst *worstErr) error {
	if e := relErr(m.AuxLoss(), ref.aux); !(e <= tol) {
		return fmt.Errorf("aux loss %v, want %v", m.AuxLoss(), ref.aux)
	} else {
		worst.see("aux loss", e)
	}
	st := m.RouterStats()
	if len(st) != len(ref.stats) {
		return fmt.Errorf("%d router stats, want %d", len(st), len(ref.stats))
	}
	for i, s := range st {
		r := ref.stats[i]
		if s.Name != r.Name || s.Tokens != r.Tokens || s.Dropped != r.Dropped || !slices.Equal(s.TokensPerExpert, r.TokensPerExpert) {
			return fmt.Errorf("router stats %+v, want %+v", s, r)
		}
		if relErr(s.LoadBalance, r.LoadBalance) > tol || relErr(s.ZLoss, r.ZLoss) > tol {
			return fmt.Errorf("router losses %v, %v, want %v, %v", s.LoadBalance, s.ZLoss, r.LoadBalance, r.ZLoss)
		}
	}
	epRank := g.EPGroup.Rank()
	for _, blk := range m.Blocks {
		mb, ok := blk.(*model.MoEBlock)
		if !ok {
			continue
		}
		if slices.Contains(sc.starvedRanks(g.EP), epRank) && g.EP > 1 {
			if n := mb.MoE.Handle().RecvRows(); n != 0 {
				return fmt.Errorf("%s: EP rank %d holds starved experts only but received %d rows", mb.Name, epRank, n)
			}
		} else if n := mb.MoE.Handle().RecvRows(); n == 0 && len(sc.starved) > 0 {
			return fmt.Errorf("%s: EP rank %d received no row, expected some", mb.Name, epRank)
		}
	}
	return nil
}

// TestMoELayoutErrors: bad MoE layouts fail in New before any allocation.
func TestMoELayoutErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		l    layout
		edit func(*layers.GPTConfig)
		bad  func(*comm.Grid)
		want string
	}{
		{"ep does not divide experts", layout{tp: 2, dp: 2, ep: 4}, func(c *layers.GPTConfig) { c.Experts = 6 }, nil, "ep 4 does not divide GPTConfig.Experts = 6"},
		{"ep does not divide world", layout{tp: 2, dp: 2, ep: 2}, nil, func(g *comm.Grid) { g.EP = 3 }, "ep 3 does not divide the world of 4"},
		{"top-k over experts", layout{tp: 2, dp: 1, ep: 2}, func(c *layers.GPTConfig) { c.TopK = 9 }, nil, "TopK = 9"},
		{"tp does not divide heads", layout{tp: 4, dp: 1, ep: 2}, func(c *layers.GPTConfig) { c.Heads, c.Dim = 6, 48 }, nil, "Heads = 6"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := moeConfig()
			if c.edit != nil {
				c.edit(&cfg)
			}
			err := onGrid(c.l, func(b tensor.Backend, g *comm.Grid) error {
				cb := newCountingMoE(b)
				gg := *g
				if c.bad != nil {
					c.bad(&gg)
				}
				return newFails(cb, cb.countingBackend, &gg, cfg, c.l.sp, c.want)
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	// A backend without MoE ops: refused before any work.
	err := onGrid(layout{tp: 2, dp: 1, ep: 2}, func(b tensor.Backend, g *comm.Grid) error {
		cb := &countingBackend{Backend: b}
		_, err := model.New(cb, g, moeConfig(), model.Options{}, tensor.Float32)
		if err == nil || !strings.Contains(err.Error(), "MoEOps") || cb.allocs != 0 {
			return fmt.Errorf("New on a backend without MoEOps: error %v after %d allocations", err, cb.allocs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A replica's tokens that TP cannot split for the MoE blocks: refused
	// before any collective.
	err = onGrid(layout{tp: 4, dp: 1, ep: 2}, func(b tensor.Backend, g *comm.Grid) error {
		m, err := model.New(b, g, moeConfig(), model.Options{}, tensor.Float32)
		if err != nil {
			return err
		}
		ids, targets := batch(1, 1, 6, 64)
		if _, err := m.Forward(ids, targets); err == nil || !strings.Contains(err.Error(), "not divisible by TP = 4, as the MoE blocks need") {
			return fmt.Errorf("Forward of 6 tokens at tp 4: error %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// countingMoE is a countingBackend that keeps the MoE ops of the backend.
type countingMoE struct {
	*countingBackend
	tensor.MoEOps
}

func newCountingMoE(b tensor.Backend) *countingMoE {
	ops, err := tensor.MoEOpsOf(b)
	if err != nil {
		panic(err)
	}
	return &countingMoE{countingBackend: &countingBackend{Backend: b}, MoEOps: ops}
}

// TestMoEFLOPs: the sharded model counts the FLOPs layers.GPT counts.
func TestMoEFLOPs(t *testing.T) {
	cfg := moeConfig()
	cfg.MoEEvery = 2
	err := onGrid(layout{tp: 2, dp: 1, ep: 2}, func(b tensor.Backend, g *comm.Grid) error {
		m, err := model.New(b, g, cfg, model.Options{}, tensor.Float32)
		if err != nil {
			return err
		}
		ref, err := layers.NewGPT(b, cfg, tensor.Float32)
		if err != nil {
			return err
		}
		if got, want := m.FLOPsPerToken(), ref.FLOPsPerToken(); math.Abs(got-want) > 1e-9*want {
			return fmt.Errorf("FLOPsPerToken %v, want %v", got, want)
		}
		if n := len(m.ExpertParams()); n != 3 {
			return fmt.Errorf("%d expert parameters, want 3 (one MoE block)", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMoETrainMatchesGPT: 20 AdamW steps of an MoE model (8 experts, top-2,
// aux and z losses, every block MoE) through train.RunSharded at TP 1, 2, 4,
// EP 1, 2, 4 and DP 1, 2 give the loss (with the aux losses) and the
// gradient norm of train.Run on layers.GPT step by step, within 1e-4.
func TestMoETrainMatchesGPT(t *testing.T) {
	cfg := moeConfig()
	cfg.AuxLossCoef, cfg.ZLossCoef = 0.01, 1e-3 // the tiny-moe preset's
	ds := corpus(4000, cfg.Vocab)
	ref, refNorms := trainReference(t, cfg, ds)
	if ref.Losses[19] >= ref.Losses[0] {
		t.Fatalf("reference run: losses %v, expected the loss to fall", ref.Losses)
	}
	for _, l := range []layout{
		{tp: 1, dp: 1, ep: 1}, {tp: 2, dp: 1, ep: 2}, {tp: 4, dp: 1, ep: 4}, {tp: 4, dp: 1, ep: 2, sp: true},
		{tp: 1, dp: 2, ep: 2}, {tp: 2, dp: 2, ep: 4, sp: true}, {tp: 2, dp: 2, ep: 1},
		{tp: 2, dp: 1, ep: 2, overlap: "pipelined"}, {tp: 4, dp: 1, ep: 2, sp: true, overlap: "pipelined"},
	} {
		t.Run(l.String(), func(t *testing.T) { matchReference(t, l, cfg, ds, ref, refNorms) })
	}
}
