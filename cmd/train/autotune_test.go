package main

import (
	"path/filepath"
	"strings"
	"testing"

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
	for _, want := range []string{"overlap: all-gather-matmul: pipelined (3 sites); auto: autotune cache " + cache,
		"overlap: matmul-reduce-scatter: pipelined (2 sites); auto: autotune cache " + cache} {
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
