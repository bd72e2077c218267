package overlap_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor/cpu"
)

func TestChooser(t *testing.T) {
	g := local.NewWorld(1)[0]
	spec := func(k overlap.Kind, name string) overlap.Spec {
		return overlap.Spec{Kind: k, Name: name, Group: g, Backend: cpu.New()}
	}
	missing := map[string]string{"fused": "not built here"}
	pipe := []overlap.Strategy{strategies.Pipelined{}}

	t.Run("precedence", func(t *testing.T) {
		ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined", Sites: map[string]string{
			"matmul-reduce-scatter": "collective", "blocks.*.attn.*": "collective", "blocks.1.attn.qkv": "pipelined"}}, pipe, missing)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			kind       overlap.Kind
			name, want string
		}{
			{overlap.KindAllGatherMatmul, "blocks.0.mlp.gate_up", "pipelined"}, // the default
			{overlap.KindMatmulReduceScatter, "blocks.0.mlp.w_down", "collective"},
			{overlap.KindAllGatherMatmul, "blocks.0.attn.qkv", "collective"}, // the pattern beats the default
			{overlap.KindAllGatherMatmul, "blocks.1.attn.qkv", "pipelined"},  // the longer pattern wins
			{overlap.KindMatmulReduceScatter, "blocks.3.attn.wo", "collective"},
		} {
			s, err := ch.Choose(spec(c.kind, c.name))
			if err != nil || s.Name() != c.want {
				t.Errorf("%s %s: got %v, %v; want %s", c.kind, c.name, s, err, c.want)
			}
		}
		if err := ch.CheckUsed(); err != nil {
			t.Errorf("every key chose a site: %v", err)
		}
	})

	t.Run("default where a kind has none", func(t *testing.T) {
		ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined"}, pipe, missing)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ch.Choose(spec(overlap.KindExpert, "blocks.0.moe"))
		if err != nil || s.Name() != "collective" {
			t.Fatalf("expert site under the default pipelined: %v, %v; want collective", s, err)
		}
		if sum := strings.Join(ch.Summary(), "\n"); !strings.Contains(sum, "expert: collective (1 site, the group's collectives); pipelined for expert site \"blocks.0.moe\": group world[0] has no symmetric memory: it needs symmetric memory with peer pointers") {
			t.Errorf("summary %q: want the expert line to say why", sum)
		}
	})

	t.Run("explicit and unavailable", func(t *testing.T) {
		ch, err := overlap.NewChooser(overlap.Config{Sites: map[string]string{"expert": "pipelined"}}, pipe, missing)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ch.Choose(spec(overlap.KindExpert, "blocks.0.moe"))
		if !errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), `sites["expert"] asks for pipelined`) {
			t.Errorf("got %v, want an ErrUnavailable naming the key", err)
		}
	})

	t.Run("auto", func(t *testing.T) {
		ch, _ := overlap.NewChooser(overlap.Config{Default: "auto"}, pipe, missing)
		s, err := ch.Choose(spec(overlap.KindAllGatherMatmul, "x"))
		if err != nil || s.Name() != "collective" || !strings.Contains(strings.Join(ch.Summary(), ""), "auto: no autotune cache yet") {
			t.Errorf("auto: %v, %v, summary %q", s, err, ch.Summary())
		}
	})

	for _, c := range []struct {
		name string
		cfg  overlap.Config
		want string
	}{
		{"unknown default", overlap.Config{Default: "fast"}, `default strategy "fast"`},
		{"unknown site strategy", overlap.Config{Sites: map[string]string{"x": "fast"}}, `site "x": strategy "fast"`},
		{"bad pattern", overlap.Config{Sites: map[string]string{"blocks.[": "collective"}}, `site pattern "blocks.["`},
		{"missing default", overlap.Config{Default: "fused"}, "strategy fused is not available in this run: not built here"},
		{"missing site", overlap.Config{Sites: map[string]string{"blocks.0.*": "fused"}}, `site "blocks.0.*": strategy fused is not available`},
	} {
		if _, err := overlap.NewChooser(c.cfg, pipe, missing); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}

	ch, _ := overlap.NewChooser(overlap.Config{Sites: map[string]string{"blocks.9.*": "pipelined"}}, pipe, missing)
	if _, err := ch.Choose(spec(overlap.KindAllGatherMatmul, "blocks.0.attn.qkv")); err != nil {
		t.Fatal(err)
	}
	if err := ch.CheckUsed(); err == nil || !strings.Contains(err.Error(), `"blocks.9.*" match no communication site`) {
		t.Errorf("CheckUsed: %v", err)
	}
	// A site kind the model has no site of is named as such, not as a name
	// that is not a kind.
	ch, _ = overlap.NewChooser(overlap.Config{Sites: map[string]string{"matmul-reduce-scatter": "pipelined"}}, pipe, missing)
	if _, err := ch.Choose(spec(overlap.KindAllGatherMatmul, "blocks.0.attn.qkv")); err != nil {
		t.Fatal(err)
	}
	err := ch.CheckUsed()
	if err == nil || !strings.Contains(err.Error(), `sites "matmul-reduce-scatter" name site kinds this model has no site of (its sites are of the kinds all-gather-matmul)`) || strings.Contains(err.Error(), "expected a site kind") {
		t.Errorf("CheckUsed with a kind the model lacks: %v", err)
	}
}
