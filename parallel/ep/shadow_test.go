package ep_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// hostPath is a test-only expert strategy under the name "pipelined": the
// collective dispatcher as an ExpertStrategy's path (so shadow mode wraps
// it), with its combined output's first row scaled by scale (0: exact).
// Its TP sites are the exchange form's.
type hostPath struct {
	overlap.Exchange
	scale float32
}

func (hostPath) Name() string { return "pipelined" }

func (hostPath) Supports(overlap.Spec) error { return nil }

func (p hostPath) NewExpertPath(c ep.ExpertConfig) (ep.ExpertPath, error) {
	d, err := ep.NewDispatcher(c.Backend, c.Group, c.Experts, c.Stream)
	if err != nil {
		return nil, err
	}
	if err := d.SetTokenGroup(c.Tokens); err != nil {
		return nil, err
	}
	d.SetMaxTokens(c.MaxTokens)
	return scaledCombine{d, c.Backend, p.scale}, nil
}

type scaledCombine struct {
	*ep.Dispatcher
	b     tensor.Backend
	scale float32
}

func (p scaledCombine) Combine(out, y, w *tensor.Tensor, h *ep.Handle) error {
	if err := p.Dispatcher.Combine(out, y, w, h); err != nil || p.scale == 0 {
		return err
	}
	row, err := out.Rows(0, 1)
	if err != nil {
		return err
	}
	p.b.Scale(row, row, p.scale)
	return nil
}

// shadowRun is one rank's results of steps of the MoE layer.
type shadowRun struct {
	out, dx []float64
	grads   [][]float64
	reports []map[string]any
	err     error
}

// runShadowedMoE runs steps steps of an EP MoE layer on P ranks with the
// strategy s (shadowed by cfg when cfg.Every > 0).
func runShadowedMoE(t *testing.T, P int, mc layers.MoEConfig, s overlap.Strategy, cfg overlap.ShadowConfig, steps int) []shadowRun {
	t.Helper()
	runs := make([]shadowRun, P)
	var mu sync.Mutex
	tokens := []int{9, 7, 5, 11}[:P]
	err := local.Run(P, func(c comm.Comm) error {
		r := c.Rank()
		b := cpu.New(cpu.WithThreads(1))
		var sh *overlap.Shadow
		var opts []overlap.ChooserOption
		if cfg.Every > 0 {
			var err error
			if sh, err = overlap.NewShadow(cfg, c, b, nil, tensor.Float32); err != nil {
				return err
			}
			opts = append(opts, overlap.WithShadow(sh))
		}
		ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined"}, []overlap.Strategy{s}, nil, opts...)
		if err != nil {
			return err
		}
		ps := layers.NewParamSet(seed)
		m, err := ep.New(b, ps, ep.Parallel{Group: c, Overlap: ch, MaxTokens: 16}, "blocks.1.moe", mc)
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, tensor.Float32); err != nil {
			return err
		}
		if sh != nil {
			if err := sh.CheckUsed(); err != nil {
				return err
			}
		}
		n, C := tokens[r], mc.Dim
		rng := testutil.Rng(uint64(40 + r))
		out, dx := b.Zeros(tensor.Float32, n, C), b.Zeros(tensor.Float32, n, C)
		var run shadowRun
		for step := 1; step <= steps && run.err == nil; step++ {
			if sh != nil {
				sh.BeginStep(step)
			}
			x := upload(b, testutil.RandFloats(rng, n*C, -1, 1), n, C)
			dout := upload(b, testutil.RandFloats(rng, n*C, -1, 1), n, C)
			if err := m.Forward(out, x); err != nil {
				return err
			}
			if err := m.Backward(dx, dout); err != nil {
				return err
			}
			if sh != nil {
				rep, err := sh.EndStep(step)
				run.err = err
				if rep != nil && err == nil {
					run.reports = append(run.reports, rep)
				}
			}
		}
		run.out, run.dx = download(t, b, out), download(t, b, dx)
		for _, p := range m.Params() {
			run.grads = append(run.grads, download(t, b, p.G))
		}
		mu.Lock()
		runs[r] = run
		mu.Unlock()
		return b.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

func bitsOf(v []float64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = math.Float64bits(x)
	}
	return out
}

// TestShadowExpertPath: a shadowed expert path that gives the collective
// dispatcher's bits reports exactly 0 in every tensor (the dispatched
// rows and the combined output, the combine backward's rows and the
// token gradients, dweights) at EP 2 and 4, dropless and with capacity
// drops, and leaves the layer's outputs and gradients bit for bit those
// of the unshadowed run; a path whose combine scales one row is caught at
// the first sampled step, in out only, and fail_above names it.
func TestShadowExpertPath(t *testing.T) {
	capped := baseCfg
	capped.CapacityFactor = 1
	for _, mc := range []layers.MoEConfig{baseCfg, capped} {
		for _, P := range []int{2, 4} {
			t.Run(fmt.Sprintf("P%d/cf%v", P, mc.CapacityFactor), func(t *testing.T) {
				plain := runShadowedMoE(t, P, mc, hostPath{}, overlap.ShadowConfig{}, 3)
				shadowed := runShadowedMoE(t, P, mc, hostPath{}, overlap.ShadowConfig{Every: 2}, 3)
				for r := range P {
					if shadowed[r].err != nil {
						t.Fatalf("rank %d: %v", r, shadowed[r].err)
					}
					same := slices.Equal(bitsOf(plain[r].out), bitsOf(shadowed[r].out)) && slices.Equal(bitsOf(plain[r].dx), bitsOf(shadowed[r].dx))
					for i := range plain[r].grads {
						same = same && slices.Equal(bitsOf(plain[r].grads[i]), bitsOf(shadowed[r].grads[i]))
					}
					if !same {
						t.Errorf("rank %d: the shadowed run's outputs or gradients differ from the unshadowed run's", r)
					}
					if len(shadowed[r].reports) != 1 {
						t.Fatalf("rank %d: %d reports of 3 steps sampled every 2, expected 1", r, len(shadowed[r].reports))
					}
					sites := shadowed[r].reports[0]["shadow"].(map[string]any)["sites"].(map[string]any)
					got := fmt.Sprint(sites)
					if want := "map[blocks.1.moe:map[dweights:map[rel:0 ulp:0] dx:map[rel:0 ulp:0] out:map[rel:0 ulp:0]]]"; got != want {
						t.Errorf("rank %d: report %s, expected %s", r, got, want)
					}
				}

				noted := runShadowedMoE(t, P, mc, hostPath{scale: 1 + 1.0/1024}, overlap.ShadowConfig{Every: 2}, 3)
				for r := range P {
					if noted[r].err != nil || len(noted[r].reports) != 1 {
						t.Fatalf("rank %d: %v, %d reports; expected 1 report without fail_above", r, noted[r].err, len(noted[r].reports))
					}
					site := noted[r].reports[0]["shadow"].(map[string]any)["sites"].(map[string]any)["blocks.1.moe"].(map[string]any)
					rel := func(slot string) float64 { return site[slot].(map[string]any)["rel"].(float64) }
					if !(rel("out") > 1e-4) || rel("dx") != 0 || rel("dweights") != 0 {
						t.Errorf("rank %d: %v: expected the perturbation (≈ 1e-3) in out only", r, site)
					}
				}

				bound := 1e-6
				bad := runShadowedMoE(t, P, mc, hostPath{scale: 1 + 1.0/1024}, overlap.ShadowConfig{Every: 2, FailAbove: &bound}, 3)
				for r := range P {
					err := bad[r].err
					if err == nil {
						t.Fatalf("rank %d: the perturbed combine was not caught", r)
					}
					for _, want := range []string{"step 2", "site blocks.1.moe (expert, pipelined): out differs", "fail_above 1e-06"} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("rank %d: %v: expected %q", r, err, want)
						}
					}
				}
			})
		}
	}
}
