package ablate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// A cache of the older format (no significance: its choices may rest on
// noise) is refused, saying to re-run the ablation; one of a newer format
// too; Save writes the current one, which loads.
func TestCacheVersion(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.json")
	if err := os.WriteFile(old, []byte(`{"entries":[{"kind":"all-gather-matmul","m":64,"spec_k":32,"spec_outs":48,"world":2,"transport":"local","gpu":"cpu","dtype":"f32","strategy":"pipelined","times_us":{}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, exists, err := LoadCache(old); !exists || err == nil || !strings.Contains(err.Error(), "format version 0, expected 2") ||
		!strings.Contains(err.Error(), "re-run the ablation") {
		t.Errorf("old cache: exists %v, %v; want refused, saying to re-run the ablation", exists, err)
	}
	newer := filepath.Join(dir, "newer.json")
	os.WriteFile(newer, []byte(`{"version":3,"entries":[]}`), 0o644)
	if _, _, err := LoadCache(newer); err == nil || !strings.Contains(err.Error(), "written by a newer asynctp") {
		t.Errorf("newer cache: %v; want refused", err)
	}
	cur := filepath.Join(dir, "cur.json")
	c := Cache{Entries: []Entry{{Kind: overlap.KindAllGatherMatmul, M: 64, K: 32, Outs: 48, World: 2, Transport: "local", GPU: "cpu", DType: "f32",
		Strategy: Pipelined, Significant: true}}}
	if err := c.Save(cur); err != nil {
		t.Fatal(err)
	}
	if got, _, err := LoadCache(cur); err != nil || got.Version != CacheVersion || len(got.Entries) != 1 || !got.Entries[0].Significant {
		t.Errorf("saved cache: %+v, %v; want version %d with its entry", got, err, CacheVersion)
	}
}

// A site whose group is one rank gets collective from the cache and from
// --autotune (nothing to exchange), without a micro-run; a site of two
// ranks the cache has no entry for gets none.
func TestWorldOneIsCollective(t *testing.T) {
	c := Cache{Entries: []Entry{{Kind: overlap.KindMatmulAllReduce, M: 64, K: 32, Outs: 64, World: 1, Transport: "local", GPU: "cpu", DType: "f32",
		Strategy: Pipelined}}}
	for _, P := range []int{1, 2} {
		err := local.Run(P, func(g comm.Comm) error {
			sp := overlap.Spec{Kind: overlap.KindMatmulAllReduce, Name: "x", Group: g, Backend: cpu.New(), Rows: 64, K: 32, Outs: []int{64}, DType: tensor.Float32}
			l := Lookup{Cache: c, Path: "c.json", Transport: "local", GPU: "cpu", DType: "f32"}
			name, from, ok := l.Tuned(sp)
			at := &AutoTune{Lookup: l, World: g, Pipelined: strategies.Pipelined{}, Reps: 3}
			aname, _, aok := at.Tuned(sp)
			if P == 1 && (!ok || name != Collective || !strings.Contains(from, "nothing to exchange") || !aok || aname != Collective || len(at.Measured().Entries) != 0) {
				t.Errorf("world 1: %s %q %v, autotune %s %v (%d measured); want collective, nothing to exchange, no micro-run", name, from, ok, aname, aok, len(at.Measured().Entries))
			}
			if P == 2 && ok {
				t.Errorf("world 2: %s %q; want no entry (the cache's is of world 1)", name, from)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The matrix's strategy names are the registry's (overlap/strategies), one
// type per name: Registry maps each of Strategies to the strategy of that
// name, and nothing else; LocalStrategies is it without fused.
func TestRegistryNames(t *testing.T) {
	reg := Registry(strategies.Options{})
	if len(reg) != len(Strategies) || len(strategies.Names) != len(Strategies) {
		t.Fatalf("registry %v (names %v), matrix %v: want the same names", reg, strategies.Names, Strategies)
	}
	for _, n := range Strategies {
		if s, ok := reg[n]; !ok || s.Name() != n {
			t.Errorf("matrix strategy %s: registry's %v", n, s)
		}
	}
	loc := LocalStrategies()
	if _, ok := loc[Fused]; ok || len(loc) != len(Strategies)-1 || loc[Pipelined] == nil || loc[Collective] == nil {
		t.Errorf("LocalStrategies %v: want collective and pipelined", loc)
	}
}
