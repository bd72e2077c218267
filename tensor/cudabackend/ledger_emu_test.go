//go:build asynctp_emu

package cudabackend

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
)

// ledgerRun trains a bf16 GPT of cfg for steps steps of batch × seq tokens
// (forward, backward, AdamW) under recompute r on b (an emulator with the
// memory ledger on), and returns its report with the parameter count and
// the losses.
func ledgerRun(t testing.TB, b *Backend, cfg layers.GPTConfig, r layers.Recompute, batch, seq, steps int) (MemReport, int, []float64) {
	t.Helper()
	m, err := layers.NewGPT(b, cfg, tensor.BFloat16)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetRecompute(r); err != nil {
		t.Fatal(err)
	}
	opt, err := optim.NewAdamWWithConfig(b, m.Params(), optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	rng := testutil.Rng(5)
	var losses []float64
	for s := range steps {
		ids := testutil.RandInts(rng, cfg.Vocab, batch, seq)
		tg := testutil.RandInts(rng, cfg.Vocab, batch, seq)
		m.ZeroGrad()
		loss, err := m.Forward(ids, tg)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(s+1, 1e-3, 1); err != nil {
			t.Fatal(err)
		}
		losses = append(losses, loss)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	rep, ok := b.MemLedger()
	if !ok {
		t.Fatal("MemLedger: off with WithMemLedger")
	}
	return rep, m.Params().Numel(), losses
}

// TestEmuMemLedger: the ledger's account of a small GPT's training adds up
// (the sites make the bytes in use at the peak; reserved is at least that),
// and its parameter and optimizer lines match the counts from the config.
func TestEmuMemLedger(t *testing.T) {
	cfg := layers.GPTConfig{Layers: 2, Dim: 128, Heads: 2, Vocab: 61, Seq: 64, Seed: 3}
	r, n, _ := ledgerRun(t, openEmu(t, WithMemLedger()), cfg, layers.RecomputeNone, 2, 64, 2)
	var sb strings.Builder
	r.Write(&sb, true)
	t.Log("\n" + sb.String())

	var sum, req int64
	for _, s := range r.Sites {
		sum += s.Bytes
		req += s.Requested
		if s.Bytes < s.Requested || s.Blocks <= 0 {
			t.Errorf("site %+v: size classes below the bytes requested, or no blocks", s)
		}
	}
	if sum != r.PeakInUse {
		t.Errorf("the sites hold %d bytes at the peak, the ledger's peak in use is %d", sum, r.PeakInUse)
	}
	if r.PeakReserved < r.PeakInUse+r.CachedAtPeak || r.PeakInUse <= 0 {
		t.Errorf("peak reserved %d < in use %d + cached %d at the in-use peak", r.PeakReserved, r.PeakInUse, r.CachedAtPeak)
	}
	var csum int64
	for _, c := range r.Categories() {
		csum += c.Bytes
	}
	if csum != sum {
		t.Errorf("categories sum to %d, sites to %d", csum, sum)
	}

	// The independent count: every parameter of the config, in bf16
	// weights and gradients, fp32 master and moments.
	c := cfg.WithDefaults()
	want := c.Vocab*c.Dim*2 + c.Layers*(2*c.Dim+4*c.Dim*c.Dim+3*c.Dim*c.FFN) + c.Dim // embed, head; norms, attention, MLP; final norm
	if n != want {
		t.Fatalf("the model has %d parameters, the config says %d", n, want)
	}
	cat := map[string]MemSite{}
	for _, s := range r.Categories() {
		cat[s.Category] = s
	}
	if p := cat[CatParams]; p.Requested != int64(2*2*n) || p.Bytes != int64(2*bucketSize(2*n)) || p.Blocks != 2 {
		t.Errorf("parameters and gradients %+v, expected 2 blocks of %d bf16 values (%d bytes, %d in size classes)", p, n, 4*n, 2*bucketSize(2*n))
	}
	if o := cat[CatOptimizer]; o.Requested != int64(3*4*n) || o.Bytes != int64(3*bucketSize(4*n)) {
		t.Errorf("optimizer state %+v, expected 3 blocks of %d fp32 values (%d bytes)", o, n, 12*n)
	}
	if a := cat[CatActivations]; a.Bytes == 0 {
		t.Error("no activations at the peak")
	}
}

// TestEmuMemLedgerOff: without WithMemLedger there is no report.
func TestEmuMemLedgerOff(t *testing.T) {
	if _, ok := openEmu(t).MemLedger(); ok {
		t.Fatal("MemLedger on without WithMemLedger")
	}
}

// TestEmuMemLedgerSizes prints the ledger for the sizes in
// $ASYNCTP_LEDGER ("layers,dim,heads,ffn,vocab,batch,seq"), the numbers
// the memory estimate of docs/measurements/2026-12-02.md scales from;
// skipped without it.
func TestEmuMemLedgerSizes(t *testing.T) {
	spec := os.Getenv("ASYNCTP_LEDGER")
	if spec == "" {
		t.Skip("set ASYNCTP_LEDGER=layers,dim,heads,ffn,vocab,batch,seq")
	}
	var v []int
	for _, f := range strings.Split(spec, ",") {
		x, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		v = append(v, x)
	}
	if len(v) != 7 {
		t.Fatalf("ASYNCTP_LEDGER=%q: expected 7 numbers", spec)
	}
	cfg := layers.GPTConfig{Layers: v[0], Dim: v[1], Heads: v[2], FFN: v[3], Vocab: v[4], Seq: v[6], TiedEmbeddings: true, Seed: 1}
	r, n, losses := ledgerRun(t, openEmu(t, WithMemLedger()), cfg, layers.RecomputeNone, v[5], v[6], 2)
	var sb strings.Builder
	r.Write(&sb, true)
	fmt.Printf("config %+v, batch %d: %d parameters, losses %v\n%s", cfg, v[5], n, losses, sb.String())
}
