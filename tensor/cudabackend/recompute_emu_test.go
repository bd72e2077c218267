//go:build asynctp_emu

package cudabackend

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/layers"
)

// category is the bytes (size classes) of a category at the in-use peak.
func category(r MemReport, cat string) int64 {
	for _, c := range r.Categories() {
		if c.Category == cat {
			return c.Bytes
		}
	}
	return 0
}

// TestEmuRecomputeLedger: on the emulator's kernels, a bf16 GPT trains
// with the same losses bit for bit under every recompute mode, and the
// layers' forward buffers at the memory peak shrink: under attention by
// the attention outputs of all blocks but one, under block to about one
// block's (the ledger's account of what each mode keeps).
func TestEmuRecomputeLedger(t *testing.T) {
	cfg := layers.GPTConfig{Layers: 4, Dim: 128, Heads: 2, Vocab: 61, Seq: 64, FFN: 256, Seed: 3}
	var acts [3]int64
	var losses [3][]float64
	for i, r := range []layers.Recompute{layers.RecomputeNone, layers.RecomputeAttention, layers.RecomputeBlock} {
		rep, _, l := ledgerRun(t, openEmu(t, WithMemLedger()), cfg, r, 2, 64, 2)
		acts[i], losses[i] = category(rep, CatActivations), l
		t.Logf("recompute %v: layers' forward buffers at the peak %d bytes, peak in use %d", r, acts[i], rep.PeakInUse)
	}
	for i := 1; i < 3; i++ {
		for s := range losses[0] {
			if math.Float64bits(losses[i][s]) != math.Float64bits(losses[0][s]) {
				t.Errorf("recompute %v step %d: loss %v, want %v (none) bit for bit", layers.Recompute(i), s+1, losses[i][s], losses[0][s])
			}
		}
	}
	// The attention outputs: (B·T, Dim) bf16 per block, 3 of the 4 dropped.
	att := int64(2*64*cfg.Dim*2) * 3
	if !(acts[1] <= acts[0]-att*9/10) {
		t.Errorf("attention recompute keeps %d bytes of forward buffers, none %d: want at least %d less", acts[1], acts[0], att*9/10)
	}
	if !(acts[2] <= acts[0]*2/5) {
		t.Errorf("block recompute keeps %d bytes of forward buffers, none %d: want at most 40 %%", acts[2], acts[0])
	}
}

// TestEmuRecomputeLedgerSizes prints the memory ledger's account of one
// training step (forward, backward, AdamW) of a bf16 GPT under each
// recompute mode at the shapes in $ASYNCTP_RECOMPUTE_LEDGER
// ("name:layers,dim,heads,ffn,vocab,batch,seq;..."), on the emulator's
// kernels with the arithmetic left out (NewEmulatedAccounting: the
// allocations of the emulated run, in seconds at any shape); skipped
// without it ($ASYNCTP_RECOMPUTE_MODES, "none,attention,block" by default,
// picks the modes: the parameters' host-side initialisation of llama-1b
// takes ~11 GB per model). BENCHMARKS.md's recompute figures come from it.
func TestEmuRecomputeLedgerSizes(t *testing.T) {
	spec := os.Getenv("ASYNCTP_RECOMPUTE_LEDGER")
	if spec == "" {
		t.Skip("set ASYNCTP_RECOMPUTE_LEDGER=name:layers,dim,heads,ffn,vocab,batch,seq;...")
	}
	modes := []layers.Recompute{layers.RecomputeNone, layers.RecomputeAttention, layers.RecomputeBlock}
	if m := os.Getenv("ASYNCTP_RECOMPUTE_MODES"); m != "" { // one mode per process keeps the host's memory down at llama-1b's size
		modes = nil
		for _, name := range strings.Split(m, ",") {
			r, err := layers.ParseRecompute(name)
			if err != nil {
				t.Fatal(err)
			}
			modes = append(modes, r)
		}
	}
	for _, item := range strings.Split(spec, ";") {
		name, dims, ok := strings.Cut(item, ":")
		var v [7]int
		if _, err := fmt.Sscanf(dims, "%d,%d,%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]); err != nil || !ok {
			t.Fatalf("%q: expected name:layers,dim,heads,ffn,vocab,batch,seq (%v)", item, err)
		}
		cfg := layers.GPTConfig{Layers: v[0], Dim: v[1], Heads: v[2], FFN: v[3], Vocab: v[4], Seq: v[6], TiedEmbeddings: true, Seed: 1}
		for _, r := range modes {
			b, err := NewEmulatedAccounting(WithMemLedger())
			if err != nil {
				t.Fatal(err)
			}
			rep, _, _ := ledgerRun(t, b, cfg, r, v[5], v[6], 1)
			mib := func(n int64) float64 { return float64(n) / (1 << 20) }
			fmt.Printf("%s %d layers, batch %d × %d, recompute %-9v: peak in use %8.1f MiB, reserved %8.1f MiB; layers' forward buffers %8.1f MiB, decoder stream %8.1f MiB, backward buffers %8.1f MiB\n",
				name, v[0], v[5], v[6], r, mib(rep.PeakInUse), mib(rep.PeakReserved), mib(category(rep, CatActivations)),
				mib(category(rep, CatStream)), mib(category(rep, CatBackward)))
			if os.Getenv("ASYNCTP_RECOMPUTE_LEDGER_SITES") != "" {
				var sb strings.Builder
				rep.Write(&sb, true)
				fmt.Print(sb.String())
			}
			_ = b.Close()
		}
	}
}
