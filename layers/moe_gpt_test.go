package layers

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

var tinyMoEConfig = GPTConfig{Layers: 2, Dim: 32, Heads: 4, Vocab: 29, Seq: 16, Seed: 42,
	Experts: 4, TopK: 2, MoEEvery: 1, AuxLossCoef: 0.01, ZLossCoef: 0.001}

func TestGPTMoEConfig(t *testing.T) {
	c := GPTConfig{Layers: 4, Dim: 16, Heads: 2, Vocab: 10, Seq: 4, Experts: 3}.WithDefaults()
	if c.TopK != 2 || c.MoEEvery != 1 {
		t.Errorf("MoE defaults: TopK %d MoEEvery %d, want 2 and 1", c.TopK, c.MoEEvery)
	}
	if c := (GPTConfig{Experts: 1}).WithDefaults(); c.TopK != 1 {
		t.Errorf("TopK default with one expert: %d", c.TopK)
	}
	if c := (GPTConfig{TopK: 0}).WithDefaults(); c.TopK != 0 || c.MoEEvery != 0 {
		t.Errorf("dense defaults changed the MoE fields: %+v", c)
	}
	c.MoEEvery = 2
	var moe []int
	for l := range c.Layers {
		if c.IsMoE(l) {
			moe = append(moe, l)
		}
	}
	if fmt.Sprint(moe) != "[1 3]" {
		t.Errorf("MoEEvery 2 of 4 layers: MoE blocks %v, want [1 3]", moe)
	}
	ok := tinyMoEConfig
	for _, tc := range []struct {
		mod  func(*GPTConfig)
		want string
	}{
		{func(c *GPTConfig) { c.Experts = -1 }, "Experts = -1"},
		{func(c *GPTConfig) { c.TopK = 5 }, "TopK = 5, expected 1 ≤ TopK ≤ Experts = 4"},
		{func(c *GPTConfig) { c.TopK = -1 }, "TopK = -1"},
		{func(c *GPTConfig) { c.MoEEvery = 3 }, "MoEEvery = 3"},
		{func(c *GPTConfig) { c.CapacityFactor = math.NaN() }, "CapacityFactor = NaN"},
		{func(c *GPTConfig) { c.AuxLossCoef = -0.1 }, "AuxLossCoef = -0.1"},
		{func(c *GPTConfig) { c.ZLossCoef = math.Inf(1) }, "ZLossCoef = +Inf"},
	} {
		cfg := ok
		tc.mod(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want an error containing %q", err, tc.want)
		}
		if _, err := NewGPT(newBackend(), cfg, tensor.Float32); err == nil {
			t.Errorf("NewGPT accepted %+v", cfg)
		}
	}
	// Dense: the MoE fields are ignored.
	dense := tinyConfig
	dense.TopK, dense.CapacityFactor = 3, 1
	if err := dense.Validate(); err != nil {
		t.Errorf("dense config with MoE fields: %v", err)
	}
	// JSON uses snake_case names, like train.Config.
	js, err := json.Marshal(tinyMoEConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"experts":4`, `"top_k":2`, `"moe_every":1`, `"capacity_factor":0`, `"aux_loss_coef":0.01`, `"z_loss_coef":0.001`} {
		if !strings.Contains(string(js), f) {
			t.Errorf("JSON %s lacks %s", js, f)
		}
	}
	var back GPTConfig
	if err := json.Unmarshal(js, &back); err != nil || back != tinyMoEConfig {
		t.Errorf("JSON round trip: %+v, %v", back, err)
	}
}

func TestGPTMoEStructure(t *testing.T) {
	cfg := tinyMoEConfig
	cfg.Layers, cfg.MoEEvery = 4, 2
	b := newBackend()
	m, err := NewGPT(b, cfg, tensor.Float32)
	noErr(t, b, err)
	for l, blk := range m.Blocks {
		if (blk.MoE != nil) != cfg.IsMoE(l) || (blk.MLP != nil) == cfg.IsMoE(l) {
			t.Errorf("block %d: MoE %v MLP %v", l, blk.MoE != nil, blk.MLP != nil)
		}
	}
	for _, name := range []string{"blocks.1.moe.router.weight", "blocks.1.moe.w_gate", "blocks.3.moe.w_down", "blocks.0.mlp.w_up.weight"} {
		if m.Params().Lookup(name) == nil {
			t.Errorf("no parameter %q", name)
		}
	}
	if s := m.Params().Lookup("blocks.1.moe.w_gate").Shape(); !s.Equal(tensor.Shape{4, cfg.WithDefaults().FFN, 32}) {
		t.Errorf("w_gate shape %v", s)
	}
	c := m.Config()
	dense := 4*32*32 + 3*32*c.FFN
	moe := 4*32*32 + 2*3*32*c.FFN + 4*32
	want := 6*float64(2*dense+2*moe+29*32) + 12*4*32*16
	if got := m.FLOPsPerToken(); got != want {
		t.Errorf("FLOPsPerToken = %v, want %v", got, want)
	}
	if m.AuxLoss() != 0 || len(m.RouterStats()) != 2 || m.RouterStats()[0].Tokens != 0 {
		t.Errorf("before Forward: aux %v stats %+v", m.AuxLoss(), m.RouterStats())
	}
}

// TestGradGPTMoE checks the gradient of the MoE model's loss (cross-entropy
// plus the auxiliary losses) against finite differences on a window of
// every parameter, with MoE in every block and in every other block, with
// and without a capacity.
func TestGradGPTMoE(t *testing.T) {
	for _, tc := range []struct {
		every int
		cf    float64
	}{{1, 0}, {2, 0}, {1, 1}} {
		t.Run(fmt.Sprintf("every=%d/cf=%v", tc.every, tc.cf), func(t *testing.T) {
			b := newBackend()
			cfg := GPTConfig{Layers: 2, Dim: 8, Heads: 2, Vocab: 11, Seq: 6, FFN: 12, InitStd: 0.3, Seed: 5,
				Experts: 4, TopK: 2, MoEEvery: tc.every, CapacityFactor: tc.cf, AuxLossCoef: 0.5, ZLossCoef: 0.25}
			m, err := NewGPT(b, cfg, tensor.Float64)
			noErr(t, b, err)
			rng := testutil.Rng(8)
			ids := testutil.RandInts(rng, cfg.Vocab, 2, 4) // 8 tokens: 2·ZLossCoef/8 is exact in float32
			tg := testutil.RandInts(rng, cfg.Vocab, 2, 4)
			tg.I32()[3] = -1
			loss := lossOf(t, b, m, ids, tg)
			m.ZeroGrad()
			loss()
			for _, blk := range m.Blocks {
				if blk.MoE != nil {
					if g := minGap(t, b, blk.MoE.Router); g < 1e-3 {
						t.Fatalf("%s: near-tie in the routing (gap %.2g): pick another seed", blk.Name, g)
					}
				}
			}
			st := m.RouterStats()
			if len(st) != 2/tc.every || (tc.cf > 0) != (st[0].Dropped > 0) {
				t.Fatalf("router stats %+v", st)
			}
			if aux := m.AuxLoss(); !(aux > 0) {
				t.Fatalf("AuxLoss = %v", aux)
			}
			noErr(t, b, m.Backward())
			_, g := m.Params().Flat()
			got := download(t, b, g)
			checkParamGrads(t, m.Params(), got, loss, rng, 12)
		})
	}
}

// TestGPTMoEOverfit: a tiny MoE model learns one small batch with SGD, and
// its load-balancing loss stays near 1.
func TestGPTMoEOverfit(t *testing.T) {
	for _, every := range []int{1, 2} {
		t.Run(fmt.Sprintf("every=%d", every), func(t *testing.T) {
			b := newBackend()
			cfg := tinyMoEConfig
			cfg.MoEEvery = every
			m, err := NewGPT(b, cfg, tensor.Float32)
			noErr(t, b, err)
			first, loss := overfit(t, b, m)
			st := m.RouterStats()
			t.Logf("loss %.4f → %.4f (aux %.4f) after 50 SGD steps; routing %+v", first, loss, m.AuxLoss(), st[0])
			if !(loss < 0.35*first) {
				t.Errorf("loss fell from %v to %v only", first, loss)
			}
			// E·Σ_e f_e·P_e is 1 when balanced but not bounded below by 1
			// (f from the top-k choices, P from the probabilities): a
			// balanced router sits within rounding noise of the run either
			// side of 1 (blocks.1 ends at 1 + 1e-5 or 1 − 3e-5 as the aux
			// gradient's last bits change).
			for _, s := range st {
				if !(s.LoadBalance >= 1-1e-3 && s.LoadBalance < 2) {
					t.Errorf("%s: load balance %v, want in [0.999, 2)", s.Name, s.LoadBalance)
				}
			}
		})
	}
}
