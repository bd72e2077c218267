//go:build asynctp_emu

package peerep

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// shadowEmuRun runs steps of the EP MoE layer's device step on P emulated
// ranks with strategy st, shadowed every step when shadow is set, and
// returns each rank's results and shadow reports.
func shadowEmuRun(t *testing.T, P int, cfg layers.MoEConfig, dt tensor.DType, tokens []int, steps int,
	st func(bar *emuworld.Barrier) overlap.Strategy, shadow bool) ([]moeResult, [][]map[string]any) {
	t.Helper()
	C, maxTok := cfg.Dim, slices.Max(tokens)
	res, reports := make([]moeResult, P), make([][]map[string]any, P)
	var mu sync.Mutex
	emulatedWith(t, P, 180*time.Second, []cudabackend.Option{cudabackend.WithGroupedGEMM(true)}, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
		b := c.B
		s := st(bar)
		var sh *overlap.Shadow
		var opts []overlap.ChooserOption
		var err error
		if shadow {
			if sh, err = overlap.NewShadow(overlap.ShadowConfig{Every: 1}, c, b, b.Stream(), dt); err != nil {
				return err
			}
			opts = append(opts, overlap.WithShadow(sh))
		}
		ch, err := overlap.NewChooser(overlap.Config{Default: s.Name()}, []overlap.Strategy{s}, nil, opts...)
		if err != nil {
			return err
		}
		ps := layers.NewParamSet(29)
		m, err := ep.New(b, ps, ep.Parallel{Group: c, MaxTokens: maxTok, Stream: b.Stream(), Overlap: ch, AuxGradScale: float64(P)}, "moe", cfg)
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, dt); err != nil {
			return err
		}
		if !m.DeviceStep() {
			return fmt.Errorf("expert path %T: not the device step", m.Dispatch)
		}
		r := c.Rank()
		rng := rand.New(rand.NewPCG(uint64(r)+61, 5))
		n := tokens[r]
		var x, dout []float64
		for range n * C {
			x = append(x, rng.NormFloat64())
			dout = append(dout, rng.NormFloat64())
		}
		xt, dt2 := upload(b, dt, x, n, C), upload(b, dt, dout, n, C)
		out, dx := b.Zeros(dt, n, C), b.Zeros(dt, n, C)
		var reps []map[string]any
		for step := 1; step <= steps; step++ {
			if sh != nil {
				sh.BeginStep(step)
			}
			if err := m.Forward(out, xt); err != nil {
				return err
			}
			if err := m.Backward(dx, dt2); err != nil {
				return err
			}
			if sh != nil {
				rep, err := sh.EndStep(step)
				if err != nil {
					return err
				}
				reps = append(reps, rep)
			}
		}
		var rr moeResult
		rr.out, rr.dx = hostVals(b, out), hostVals(b, dx)
		for _, p := range m.Params() {
			rr.grads = append(rr.grads, hostVals(b, p.G))
		}
		mu.Lock()
		res[r], reports[r] = rr, reps
		mu.Unlock()
		return b.Err()
	})
	return res, reports
}

// TestEmuShadowDeviceStep: shadow mode on the expert path's device step,
// pipelined and fused, against the collective dispatcher at EP 2, f32 and
// bf16, dropless and with capacity drops, over two steps: every tensor the
// shadow compares (the dispatched rows, the combined output, the combine
// backward's rows, the token gradients, dweights) is reported with
// exactly 0 relative difference and 0 ULP — the device step gives the
// collective path's bits — and the layer's outputs and gradients are the
// unshadowed run's bit for bit.
func TestEmuShadowDeviceStep(t *testing.T) {
	for _, cf := range []float64{0, 1} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("cf%v/%v", cf, dt), func(t *testing.T) {
				cfg := layers.MoEConfig{Dim: 16, Hidden: 24, Experts: 8, TopK: 2, CapacityFactor: cf,
					AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.5, OutStd: 0.3}
				tokens := []int{9, 6}
				for _, s := range deviceStrategies {
					plain, _ := shadowEmuRun(t, 2, cfg, dt, tokens, 2, s.st, false)
					got, reports := shadowEmuRun(t, 2, cfg, dt, tokens, 2, s.st, true)
					for r := range 2 {
						bits := func(v []float64) []uint64 {
							out := make([]uint64, len(v))
							for i, x := range v {
								out[i] = math.Float64bits(x)
							}
							return out
						}
						same := slices.Equal(bits(got[r].out), bits(plain[r].out)) && slices.Equal(bits(got[r].dx), bits(plain[r].dx))
						for i := range plain[r].grads {
							same = same && slices.Equal(bits(got[r].grads[i]), bits(plain[r].grads[i]))
						}
						if !same {
							t.Errorf("%s rank %d: the shadowed run's outputs or gradients differ from the unshadowed run's", s.name, r)
						}
						if len(reports[r]) != 2 {
							t.Fatalf("%s rank %d: %d reports, expected one per step", s.name, r, len(reports[r]))
						}
						for i, rep := range reports[r] {
							want := "map[moe:map[dweights:map[rel:0 ulp:0] dx:map[rel:0 ulp:0] out:map[rel:0 ulp:0]]]"
							if got := fmt.Sprint(rep["shadow"].(map[string]any)["sites"]); got != want {
								t.Errorf("%s rank %d step %d: %s, expected %s (the collective path's bits)", s.name, r, i+1, got, want)
							}
						}
					}
				}
			})
		}
	}
}

// scaledPath is the pipelined path with its device combine's first output
// row scaled by 1 + 2⁻⁷ (a perturbation bf16 represents).
type scaledPath struct {
	named
}

func (p scaledPath) NewExpertPath(c ep.ExpertConfig) (ep.ExpertPath, error) {
	path, err := New(c, p.Options...)
	if err != nil {
		return nil, err
	}
	return scaledCombine{path, c.Backend}, nil
}

type scaledCombine struct {
	*Path
	b tensor.Backend
}

func (p scaledCombine) CombineDevice(out, ye, weights *tensor.Tensor, h *ep.Handle) error {
	if err := p.Path.CombineDevice(out, ye, weights, h); err != nil {
		return err
	}
	row, err := out.Rows(0, 1)
	if err != nil {
		return err
	}
	p.b.Scale(row, row, 1+1.0/128)
	return nil
}

// TestEmuShadowCatchesDeviceCombine: a device step whose combine scales
// one row is caught at every sampled step, in out only.
func TestEmuShadowCatchesDeviceCombine(t *testing.T) {
	cfg := layers.MoEConfig{Dim: 16, Hidden: 24, Experts: 8, TopK: 2, AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.5, OutStd: 0.3}
	st := func(bar *emuworld.Barrier) overlap.Strategy {
		return scaledPath{pipelinedStrategy(WithBeforeWait(bar.Wait))}
	}
	_, reports := shadowEmuRun(t, 2, cfg, tensor.BFloat16, []int{9, 6}, 1, st, true)
	for r := range 2 {
		site := reports[r][0]["shadow"].(map[string]any)["sites"].(map[string]any)["moe"].(map[string]any)
		rel := func(slot string) float64 { return site[slot].(map[string]any)["rel"].(float64) }
		if !(rel("out") > 1e-3) || rel("dx") != 0 || rel("dweights") != 0 {
			t.Errorf("rank %d: %v: expected the perturbation (≈ 8e-3) in out only", r, site)
		}
	}
}
