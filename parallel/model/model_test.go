package model_test

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// worstErr records the largest relative error seen per quantity, for the
// log of the acceptance test.
type worstErr struct {
	mu sync.Mutex
	m  map[string]float64
}

func (w *worstErr) see(what string, e float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]float64{}
	}
	w.m[what] = math.Max(w.m[what], e)
}

// TestModelMatchesGPT is the acceptance test: for TP ∈ {1, 2, 4},
// DP ∈ {1, 2} and sequence parallelism on and off, the sharded model's
// loss, logits and every gradient equal those of layers.GPT on the same
// global batch, within 1e-5 (f32) — and within 1e-11 in f64.
func TestModelMatchesGPT(t *testing.T) {
	const B, T = 4, 8
	type variant struct {
		dt   tensor.DType
		tied bool
	}
	variants := []variant{{tensor.Float32, false}, {tensor.Float32, true}, {tensor.Float64, false}}
	for _, v := range variants {
		cfg := smallConfig()
		cfg.TiedEmbeddings = v.tied
		ids, targets := batch(3, B, T, cfg.Vocab)
		ref := runReference(t, cfg, v.dt, ids, targets)
		tol := 1e-5
		if v.dt == tensor.Float64 {
			tol = 1e-11
		}
		var worst worstErr
		for _, tpn := range []int{1, 2, 4} {
			for _, dp := range []int{1, 2} {
				for _, sp := range []bool{false, true} {
					for _, ov := range strategyNames {
						l := layout{tp: tpn, dp: dp, sp: sp, overlap: ov}
						t.Run(fmt.Sprintf("%v/tied=%v/%v", v.dt, v.tied, l), func(t *testing.T) {
							err := onGrid(l, func(b tensor.Backend, g *comm.Grid) error {
								return checkAgainst(b, g, cfg, l, v.dt, ids, targets, ref, tol, &worst, checkHooks{})
							})
							if err != nil {
								t.Fatal(err)
							}
						})
					}
				}
			}
		}
		t.Logf("%v tied=%v: worst relative errors %v", v.dt, v.tied, worst.m)
	}
}

// checkAgainst runs one rank's forward and backward and compares it with
// the reference. The forward and backward run twice (with ZeroGrad), to
// cover the reuse of activations.
func checkAgainst(b tensor.Backend, g *comm.Grid, cfg layers.GPTConfig, l layout, dt tensor.DType,
	ids, targets *tensor.Tensor, ref reference, tol float64, worst *worstErr, hooks checkHooks) error {
	m, err := newModel(b, g, cfg, l, dt)
	if err != nil {
		return err
	}
	if hooks.tweak != nil {
		if err := hooks.tweak(b, m.Params()); err != nil {
			return err
		}
	}
	for range 2 {
		m.ZeroGrad()
		loss, err := m.Forward(ids, targets)
		if err != nil {
			return err
		}
		if e := relErr(loss, ref.loss); !(e <= tol) {
			return fmt.Errorf("loss %v, want %v (relative error %.3g)", loss, ref.loss, e)
		} else {
			worst.see("loss", e)
		}
		if err := m.Backward(); err != nil {
			return err
		}
	}
	// Logits: this rank's replica rows and vocabulary columns.
	lo, hi := m.ReplicaRows(ids.Dim(0))
	T, V := ids.Dim(1), cfg.Vocab
	vl := V / l.tp
	c0 := g.TPGroup.Rank() * vl
	var want []float64
	for r := lo * T; r < hi*T; r++ {
		want = append(want, ref.logits[r*V+c0:r*V+c0+vl]...)
	}
	got := testutil.Download(b, m.Logits())
	if err := testutil.Within("logits", got, want, tol); err != nil {
		return err
	}
	worst.see("logits", relErrs(got, want))
	// Every parameter: exactly the reference's slice, gradient within tol.
	names := map[string]bool{}
	for _, s := range m.Shards() {
		names[s.Param.Name] = true
		if err := testutil.Within(s.Param.Name+" weight", testutil.Download(b, s.Param.W), testutil.Slice(ref.w[s.Param.Name], s.Full, s.Dim, s.Lo, s.Hi), 0); err != nil {
			return err
		}
		gv, want := testutil.Download(b, s.Param.G), testutil.Slice(ref.g[s.Param.Name], s.Full, s.Dim, s.Lo, s.Hi)
		if err := testutil.Within(s.Param.Name+" gradient", gv, want, tol); err != nil {
			return err
		}
		worst.see("gradients", relErrs(gv, want))
	}
	for name := range ref.g {
		if !names[name] {
			return fmt.Errorf("parameter %q of layers.GPT has no shard in the sharded model", name)
		}
	}
	ss, err := m.GradSumSquares()
	if err != nil {
		return err
	}
	if e := relErr(ss, ref.sumSquare); !(e <= tol) {
		return fmt.Errorf("GradSumSquares %v, want %v (relative error %.3g)", ss, ref.sumSquare, e)
	} else {
		worst.see("grad sum of squares", e)
	}
	dev := b.Zeros(layerkit.StatDType(dt), 1)
	b.Fill(dev, 0.25) // GradSumSquaresTo adds
	if err := m.GradSumSquaresTo(dev); err != nil {
		return err
	}
	if got := testutil.Download(b, dev)[0] - 0.25; !(relErr(got, ref.sumSquare) <= max(tol, 1e-6)) {
		return fmt.Errorf("GradSumSquaresTo %v, want %v (relative error %.3g)", got, ref.sumSquare, relErr(got, ref.sumSquare))
	}
	if hooks.after != nil {
		return hooks.after(m)
	}
	return nil
}

// checkHooks adapt checkAgainst: tweak changes the parameters after New
// (as on the reference), after checks more once the comparison passed.
type checkHooks struct {
	tweak tweakFunc
	after func(m *model.Model) error
}

func relErrs(got, want []float64) float64 { return testutil.RelErr(got, want) }

// With an asynchronous transport (data ops return before they have run)
// the results are the same: every collective's Work is waited for before
// its buffers are used (the race detector checks it under -race).
func TestAsyncTransport(t *testing.T) {
	cfg := smallConfig()
	ids, targets := batch(3, 4, 8, cfg.Vocab)
	ref := runReference(t, cfg, tensor.Float32, ids, targets)
	for _, l := range []layout{{tp: 2, dp: 2, sp: true}, {tp: 2, dp: 2, sp: false},
		{tp: 2, dp: 2, sp: true, overlap: "pipelined"}, {tp: 4, dp: 1, sp: false, overlap: "pipelined"}} {
		err := onGrid(l, func(b tensor.Backend, g *comm.Grid) error {
			return checkAgainst(b, g, cfg, l, tensor.Float32, ids, targets, ref, 1e-5, &worstErr{}, checkHooks{})
		}, local.Async())
		if err != nil {
			t.Fatalf("%v: %v", l, err)
		}
	}
}

// Forward without targets gives the logits and no loss; Backward is then
// refused.
func TestForwardWithoutTargets(t *testing.T) {
	cfg := smallConfig()
	ids, targets := batch(3, 4, 8, cfg.Vocab)
	ref := runReference(t, cfg, tensor.Float32, ids, targets)
	err := onGrid(layout{tp: 2, dp: 1, sp: true}, func(b tensor.Backend, g *comm.Grid) error {
		m, err := newModel(b, g, cfg, layout{tp: 2, dp: 1, sp: true}, tensor.Float32)
		if err != nil {
			return err
		}
		loss, err := m.Forward(ids, nil)
		if err != nil || loss != 0 {
			return fmt.Errorf("Forward(ids, nil) = %v, %v, want 0, nil", loss, err)
		}
		vl := cfg.Vocab / 2
		c0 := g.TPGroup.Rank() * vl
		var want []float64
		for r := range 4 * 8 {
			want = append(want, ref.logits[r*cfg.Vocab+c0:r*cfg.Vocab+c0+vl]...)
		}
		if err := testutil.Within("logits", testutil.Download(b, m.Logits()), want, 1e-5); err != nil {
			return err
		}
		if err := m.Backward(); err == nil {
			return fmt.Errorf("Backward after a Forward without targets: no error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLayoutAndConfig(t *testing.T) {
	err := onGrid(layout{tp: 2, dp: 2, sp: true}, func(b tensor.Backend, g *comm.Grid) error {
		m, err := newModel(b, g, smallConfig(), layout{tp: 2, dp: 2, sp: true}, tensor.Float32)
		if err != nil {
			return err
		}
		r := g.World.Rank()
		want := model.Layout{TP: 2, DP: 2, EP: 1, SequenceParallel: true, Rank: r, TPRank: r % 2, DPRank: r / 2, World: 4}
		if got := m.Layout(); got != want {
			return fmt.Errorf("Layout() = %+v, want %+v", got, want)
		}
		if m.Config().FFN != 64 || m.FLOPsPerToken() <= 0 {
			return fmt.Errorf("Config %+v, FLOPsPerToken %v", m.Config(), m.FLOPsPerToken())
		}
		if lo, hi := m.ReplicaRows(8); lo != r/2*4 || hi != lo+4 {
			return fmt.Errorf("ReplicaRows(8) = %d, %d on rank %d", lo, hi, r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestForwardAsync: at TP 2 × DP 2 (with and without sequence
// parallelism), ForwardAsync and Backward read nothing back to the host;
// ReadLoss afterwards gives layers.GPT's loss of the global batch, and the
// gradients are still those of the unsharded model.
func TestForwardAsync(t *testing.T) {
	cfg := smallConfig()
	ids, targets := batch(4, 4, 8, cfg.Vocab)
	ref := runReference(t, cfg, tensor.Float64, ids, targets)
	for _, l := range []layout{{tp: 2, dp: 2, sp: true}, {tp: 2, dp: 2, sp: false}} {
		err := local.Run(l.tp*l.dp, func(c comm.Comm) error {
			b := &testutil.HostReads{Backend: cpu.New(cpu.WithThreads(1))}
			g, err := comm.NewGrid(c, l.dp, l.tp, 1)
			if err != nil {
				return err
			}
			defer g.Close()
			m, err := newModel(b, g, cfg, l, tensor.Float64)
			if err != nil {
				return err
			}
			if _, err := m.ReadLoss(); err == nil || !strings.Contains(err.Error(), "needs a successful Forward") {
				return fmt.Errorf("ReadLoss before a forward: %v", err)
			}
			before := b.Count()
			if err := m.ForwardAsync(ids, targets); err != nil {
				return err
			}
			if err := m.Backward(); err != nil {
				return err
			}
			if n := b.Count() - before; n != 0 {
				return fmt.Errorf("ForwardAsync and Backward read the device %d times, want 0", n)
			}
			loss, err := m.ReadLoss()
			if err != nil {
				return err
			}
			if e := relErr(loss, ref.loss); !(e <= 1e-12) {
				return fmt.Errorf("ReadLoss %v, layers.GPT %v (relative error %.3g)", loss, ref.loss, e)
			}
			for _, s := range m.Shards() {
				want := testutil.Slice(ref.g[s.Param.Name], s.Full, s.Dim, s.Lo, s.Hi)
				if err := testutil.Within(s.Param.Name+" gradient", testutil.Download(b, s.Param.G), want, 1e-11); err != nil {
					return err
				}
			}
			return b.Err()
		}, local.WithTimeout(30*time.Second))
		if err != nil {
			t.Fatalf("%v: %v", l, err)
		}
	}
}

// TestGQAModelMatchesGPT: a grouped-query model (4 query heads, 2
// key/value heads) sharded over TP 1 and 2, with and without sequence
// parallelism, at DP 1 and 2, equals layers.GPT on the same batch within
// TestModelMatchesGPT's tolerances (each TP rank holds one key/value head
// and the two query heads that read it), and its wk, wv shards are half
// the multi-head model's. A TP size that does not divide the key/value
// heads is refused naming both.
func TestGQAModelMatchesGPT(t *testing.T) {
	const B, T = 4, 8
	cfg := smallConfig()
	cfg.KVHeads = 2
	ids, targets := batch(5, B, T, cfg.Vocab)
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		ref := runReference(t, cfg, dt, ids, targets)
		tol := map[tensor.DType]float64{tensor.Float32: 1e-5, tensor.Float64: 1e-11}[dt]
		var worst worstErr
		for _, l := range []layout{{tp: 1, dp: 1}, {tp: 2, dp: 1}, {tp: 2, dp: 1, sp: true}, {tp: 2, dp: 2, sp: true}, {tp: 1, dp: 2}} {
			for _, ov := range strategyNames {
				l.overlap = ov
				t.Run(fmt.Sprintf("%v/%v", dt, l), func(t *testing.T) {
					err := onGrid(l, func(b tensor.Backend, g *comm.Grid) error {
						return checkAgainst(b, g, cfg, l, dt, ids, targets, ref, tol, &worst, checkHooks{after: func(m *model.Model) error {
							mha := cfg
							mha.KVHeads = 0
							full, err := newModel(b, g, mha, l, dt)
							if err != nil {
								return err
							}
							kv := map[string]int{}
							for _, s := range full.Shards() {
								if strings.HasSuffix(s.Param.Name, ".wk.weight") || strings.HasSuffix(s.Param.Name, ".wv.weight") {
									kv[s.Param.Name] = s.Param.Numel()
								}
							}
							for _, s := range m.Shards() {
								if n, ok := kv[s.Param.Name]; ok && 2*s.Param.Numel() != n {
									return fmt.Errorf("%s has %d elements on this rank, the multi-head model's %d: want half", s.Param.Name, s.Param.Numel(), n)
								}
							}
							if len(kv) != 2*cfg.Layers {
								return fmt.Errorf("%d wk, wv shards in the multi-head model, want %d", len(kv), 2*cfg.Layers)
							}
							return nil
						}})
					})
					if err != nil {
						t.Fatal(err)
					}
				})
			}
		}
		t.Logf("%v: worst relative errors %v", dt, worst.m)
	}
	err := onGrid(layout{tp: 4, dp: 1}, func(b tensor.Backend, g *comm.Grid) error {
		_, err := newModel(b, g, cfg, layout{tp: 4, dp: 1, overlap: "collective"}, tensor.Float32)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "layout tp 4 does not divide GPTConfig.KVHeads = 2") {
		t.Fatalf("TP 4 over 2 key/value heads: %v, want a refusal naming both", err)
	}
}
