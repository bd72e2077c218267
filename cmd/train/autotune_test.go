package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/ablate"
	"github.com/asynctp/asynctp/overlap"
)

// autotuneCache writes a cache that picks pipelined for every site of
// par's model at --tp 2 --sequence-parallel (width 32, FFN 128, vocab 256,
// 4·16 tokens) on goroutine ranks, as cmd/ablate would.
func autotuneCache(t *testing.T, strategy string) string {
	t.Helper()
	entry := func(k overlap.Kind, K, outs int) ablate.Entry {
		return ablate.Entry{Kind: k, M: 64, K: K, Outs: outs, World: 2, Transport: "local", GPU: "cpu", DType: "f32", Strategy: strategy}
	}
	c := ablate.Cache{Entries: []ablate.Entry{
		entry(overlap.KindAllGatherMatmul, 32, 48),     // qkv
		entry(overlap.KindAllGatherMatmul, 32, 128),    // gate_up and the LM head
		entry(overlap.KindMatmulReduceScatter, 16, 32), // attention out
		entry(overlap.KindMatmulReduceScatter, 64, 32), // down
	}}
	path := filepath.Join(t.TempDir(), "autotune.json")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// --overlap auto with a cache that picks pipelined: every site says it
// took pipelined from the cache, and 20 steps follow --overlap collective
// within 1e-5.
func TestOverlapAutoFromCache(t *testing.T) {
	cache := autotuneCache(t, "pipelined")
	args := []string{"--tp", "2", "--sequence-parallel"}
	msg, code := runMain(t, par(filepath.Join(t.TempDir(), "out"), append(args, "--overlap", "auto", "--autotune-cache", cache)...)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, msg)
	}
	for _, want := range []string{"overlap: all-gather-matmul: pipelined (3 sites, exchanges on the group's collectives over local); auto: autotune cache " + cache,
		"overlap: matmul-reduce-scatter: pipelined (2 sites, exchanges on the group's collectives over local); auto: autotune cache " + cache} {
		if !strings.Contains(msg, want) {
			t.Errorf("want %q in the start-up summary; output:\n%s", want, msg)
		}
	}
	coll := metrics(t, trainRun(t, append(args, "--overlap", "collective")...))
	auto := metrics(t, trainRun(t, append(args, "--overlap", "auto", "--autotune-cache", cache)...))
	if len(auto) != 20 {
		t.Fatalf("%d steps, want 20", len(auto))
	}
	sameRun(t, "auto from the cache", auto, coll, 1e-5)
}

// A cache given explicitly must exist; one at the default place may not.
func TestOverlapAutoCacheMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.json")
	msg, code := runMain(t, par(filepath.Join(t.TempDir(), "out"), "--tp", "2", "--overlap", "auto", "--autotune-cache", missing)...)
	if code == 0 || !strings.Contains(msg, "--autotune-cache "+missing+": no such file") {
		t.Errorf("exit %d, want non-zero naming the missing cache; output:\n%s", code, msg)
	}
}

// --overlap auto --autotune with no cache: every TP site kind is tuned at
// start (the summary says so), the cache file is written with an entry
// per site shape, each verified and timed for both strategies, and the 20
// steps follow --overlap collective within 1e-5. A second run finds every
// site in the cache and tunes nothing.
func TestAutotuneWritesCache(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "tuned", "autotune.json")
	args := []string{"--tp", "2", "--sequence-parallel", "--overlap", "auto", "--autotune", "--autotune-cache", cache}
	out := filepath.Join(t.TempDir(), "out")
	msg, code := runMain(t, par(out, args...)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, msg)
	}
	for _, want := range []string{"overlap: all-gather-matmul: ", "overlap: matmul-reduce-scatter: "} {
		i := strings.Index(msg, want)
		if i < 0 || !strings.Contains(msg[i:i+strings.Index(msg[i:], "\n")], "auto: autotuned at start") {
			t.Errorf("want %q…auto: autotuned at start in the summary; output:\n%s", want, msg)
		}
	}
	t.Log(msg)
	c, exists, err := ablate.LoadCache(cache)
	if err != nil || !exists {
		t.Fatalf("cache %s: exists %v, %v", cache, exists, err)
	}
	// qkv (K 32, outs 48), gate_up and the LM head (K 32, outs 128: one
	// shape), attention out (K 16, outs 32), down (K 64, outs 32).
	type key struct {
		kind    overlap.Kind
		k, outs int
	}
	want := map[key]bool{{overlap.KindAllGatherMatmul, 32, 48}: true, {overlap.KindAllGatherMatmul, 32, 128}: true,
		{overlap.KindMatmulReduceScatter, 16, 32}: true, {overlap.KindMatmulReduceScatter, 64, 32}: true}
	for _, e := range c.Entries {
		k := key{e.Kind, e.K, e.Outs}
		if !want[k] || e.M != 64 || e.World != 2 || e.Transport != "local" || e.GPU != "cpu" || e.DType != "f32" {
			t.Errorf("unexpected entry %+v", e)
		}
		delete(want, k)
		// Pipelined only where it is faster beyond the noise; else
		// collective, significant only where pipelined is slower.
		vs, ok := e.VsCollective["pipelined"]
		faster := ok && vs.Verdict == ablate.Faster
		if len(e.TimesUS) != 2 || !(e.TimesUS["collective"] > 0) || !(e.TimesUS["pipelined"] > 0) || !ok || vs.Rounds != 15 ||
			(e.Strategy == "pipelined") != faster || e.Significant != (vs.Verdict != ablate.NoDiff) {
			t.Errorf("entry %+v: want both strategies timed over 15 rounds, pipelined chosen only where faster beyond the noise", e)
		}
	}
	if len(want) > 0 {
		t.Errorf("no cache entries for %v; cache:\n%+v", want, c.Entries)
	}
	coll := metrics(t, trainRun(t, "--tp", "2", "--sequence-parallel", "--overlap", "collective"))
	sameRun(t, "autotune", metrics(t, out), coll, 1e-5)

	msg, code = runMain(t, par(filepath.Join(t.TempDir(), "out2"), args...)...)
	if code != 0 || strings.Contains(msg, "autotuned at start") || !strings.Contains(msg, "auto: autotune cache "+cache) {
		t.Errorf("second run: exit %d, want every site from the cache; output:\n%s", code, msg)
	}
	if c2, _, _ := ablate.LoadCache(cache); len(c2.Entries) != len(c.Entries) {
		t.Errorf("second run: %d entries, want %d", len(c2.Entries), len(c.Entries))
	}
}

// --autotune without "auto" is refused: nothing would use the timings.
func TestAutotuneNeedsAuto(t *testing.T) {
	msg, code := runMain(t, par(filepath.Join(t.TempDir(), "out"), "--tp", "2", "--autotune")...)
	if code == 0 || !strings.Contains(msg, "--autotune: expected --overlap auto") {
		t.Errorf("exit %d, want non-zero refusing --autotune; output:\n%s", code, msg)
	}
}

// With two DP replicas the two TP groups tune apart and agree over the
// world: the run trains (a disagreement would fail or hang the world's
// collectives) and follows --overlap collective.
func TestAutotuneAgreesOverDP(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "autotune.json")
	out := filepath.Join(t.TempDir(), "out")
	layout := []string{"--tp", "2", "--dp", "2", "--sequence-parallel"}
	msg, code := runMain(t, par(out, append(layout, "--overlap", "auto", "--autotune", "--autotune-cache", cache)...)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, msg)
	}
	c, _, err := ablate.LoadCache(cache)
	if err != nil || len(c.Entries) != 4 {
		t.Fatalf("cache: %d entries, %v; want 4", len(c.Entries), err)
	}
	for _, e := range c.Entries {
		if e.M != 32 || e.World != 2 {
			t.Errorf("entry %+v: want M 32 (a replica's tokens), world 2 (the TP group)", e)
		}
	}
	sameRun(t, "autotune dp 2", metrics(t, out), metrics(t, trainRun(t, append(layout, "--overlap", "collective")...)), 1e-5)
}

// The ablation's "tiny" model is this program's tiny presets: a cache
// written from the ablation's cells of it (every TP site at world 2 on
// goroutine ranks, as cmd/ablate --preset quick runs them) has an entry for
// every TP site of a tiny run at --tp 2, with and without sequence
// parallelism, and of tiny-moe's (the sites' keys are those --autotune
// writes for the run), and the run takes its choices from it.
func TestOverlapAutoFromAblation(t *testing.T) {
	m := ablate.Matrix{Ops: []ablate.Op{ablate.OpAllGatherMatmul, ablate.OpMatmulReduceScatter, ablate.OpMatmulAllReduce}, Models: []string{"tiny"},
		Ms: []int{512}, Worlds: []int{2}, Transports: []string{"local"}, Strategies: []string{ablate.Collective, ablate.Pipelined}, DType: "f32",
		Warmup: 0, Reps: 2, Alpha: ablate.DefaultAlpha, MinEffect: ablate.DefaultMinEffectCPU}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	var cells []ablate.Cell
	for _, c := range m.Cells() {
		if ablate.Runnable(c, 0, "no GPU") == "" {
			cells = append(cells, c)
		}
	}
	rs, err := ablate.RunLocal(2, cells, ablate.LocalStrategies(), m.Warmup, m.Reps, 1, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := m.Stats().For(rs)
	ablate.Derive(rs, st)
	c := ablate.FromResults(rs, "cpu", st)
	path := filepath.Join(t.TempDir(), "autotune.json")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--model", "tiny"}, {"--model", "tiny", "--sequence-parallel"}, {"--model", "tiny-moe", "--sequence-parallel"}} {
		kinds := []string{"matmul-all-reduce"}
		if slices.Contains(args, "--sequence-parallel") {
			kinds = []string{"all-gather-matmul", "matmul-reduce-scatter"}
		}
		msg, code := runMain(t, append(args, "--tp", "2", "--steps", "2", "--device", "cpu", "--out", filepath.Join(t.TempDir(), "out"),
			"--overlap", "auto", "--autotune-cache", path)...)
		if code != 0 {
			t.Fatalf("%v: exit %d:\n%s", args, code, msg)
		}
		// Every site's key, as --autotune writes it.
		sites := filepath.Join(t.TempDir(), "sites.json")
		if msg, code := runMain(t, append(args, "--tp", "2", "--steps", "1", "--device", "cpu", "--out", filepath.Join(t.TempDir(), "out"),
			"--overlap", "auto", "--autotune", "--autotune-cache", sites)...); code != 0 {
			t.Fatalf("%v --autotune: exit %d:\n%s", args, code, msg)
		}
		want, _, err := ablate.LoadCache(sites)
		if err != nil || len(want.Entries) == 0 {
			t.Fatalf("%v --autotune: %d entries, %v", args, len(want.Entries), err)
		}
		for _, w := range want.Entries {
			found := false
			for _, e := range c.Entries {
				found = found || e.Kind == w.Kind && e.K == w.K && e.Outs == w.Outs && e.World == w.World && e.Transport == w.Transport && e.DType == w.DType
			}
			if !found {
				t.Errorf("%v: the ablation's cache has no entry for site %s (%s K %d outs %d)", args, w.Shape, w.Kind, w.K, w.Outs)
			}
		}
		for _, k := range kinds {
			line := ""
			for _, l := range strings.Split(msg, "\n") {
				if strings.HasPrefix(l, "overlap: "+k+": ") {
					line = l
				}
			}
			if !strings.Contains(line, "auto: autotune cache "+path) || strings.Contains(line, "no entry") {
				t.Errorf("%v: %s sites: %q; want a choice from the cache %s", args, k, line, path)
			}
		}
	}
}
