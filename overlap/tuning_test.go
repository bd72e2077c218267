package overlap_test

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// fakeTuning has an entry for one site kind only.
type fakeTuning struct {
	kind overlap.Kind
	name string
}

func (f fakeTuning) Tuned(sp overlap.Spec) (string, string, bool) {
	if sp.Kind != f.kind {
		return "", "", false
	}
	return f.name, "fake cache entry " + string(sp.Kind), true
}

// "auto" with a cache: the kind it has an entry for gets the cached
// strategy, with where it came from; the others collective, saying why; a
// cached strategy this run cannot build falls back to collective.
func TestChooserTuning(t *testing.T) {
	g := local.NewWorld(1)[0]
	spec := func(k overlap.Kind) overlap.Spec {
		return overlap.Spec{Kind: k, Name: "blocks.0." + string(k), Group: g, Backend: cpu.New()}
	}
	ch, err := overlap.NewChooser(overlap.Config{Default: "auto"}, []overlap.Strategy{strategies.Pipelined{}}, nil,
		overlap.WithTuning(fakeTuning{overlap.KindAllGatherMatmul, "pipelined"}))
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[overlap.Kind]string{overlap.KindAllGatherMatmul: "pipelined", overlap.KindMatmulReduceScatter: "collective"} {
		s, err := ch.Choose(spec(kind))
		if err != nil || s.Name() != want {
			t.Errorf("%s: got %v, %v; want %s", kind, s, err, want)
		}
	}
	sum := strings.Join(ch.Summary(), "\n")
	for _, w := range []string{"all-gather-matmul: pipelined (1 site, exchanges on the group's collectives); auto: fake cache entry all-gather-matmul",
		"matmul-reduce-scatter: collective (1 site, the group's collectives); auto: the autotune cache has no entry for this site, so collective"} {
		if !strings.Contains(sum, w) {
			t.Errorf("summary lacks %q:\n%s", w, sum)
		}
	}

	ch, err = overlap.NewChooser(overlap.Config{Default: "auto"}, nil, map[string]string{"fused": "not built"},
		overlap.WithTuning(fakeTuning{overlap.KindAllGatherMatmul, "fused"}))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ch.Choose(spec(overlap.KindAllGatherMatmul))
	if err != nil || s.Name() != "collective" {
		t.Fatalf("cached fused that cannot run: got %v, %v; want collective", s, err)
	}
	if sum := strings.Join(ch.Summary(), "\n"); !strings.Contains(sum, "picks fused, which cannot run here") {
		t.Errorf("summary does not say the cached strategy cannot run:\n%s", sum)
	}
}
