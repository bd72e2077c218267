package hf

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// Params lists exactly the parameters layers.GPT registers, with their
// shapes, dense and MoE, tied and not.
func TestParamsMatchGPT(t *testing.T) {
	for _, c := range []layers.GPTConfig{
		{Layers: 2, Dim: 16, Heads: 2, Vocab: 40, Seq: 8, TiedEmbeddings: true},
		{Layers: 2, Dim: 16, Heads: 4, Vocab: 40, Seq: 8, FFN: 24, Experts: 4, TopK: 2, MoEEvery: 2},
		{Layers: 1, Dim: 16, Heads: 4, KVHeads: 2, Vocab: 40, Seq: 8}, // grouped-query: wk, wv (8, 16)
	} {
		g, err := layers.NewGPT(cpu.New(), c, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		var got []Param
		for _, p := range g.Params().Params() {
			got = append(got, Param{Name: p.Name, Shape: p.Shape()})
		}
		want := Params(c)
		byName := func(a, b Param) int { return strings.Compare(a.Name, b.Name) }
		slices.SortFunc(got, byName)
		slices.SortFunc(want, byName)
		if len(got) != len(want) {
			t.Fatalf("%d params, layers.GPT has %d", len(want), len(got))
		}
		for i := range want {
			if got[i].Name != want[i].Name || !slices.Equal(got[i].Shape, want[i].Shape) || want[i].Expert != IsExpert(want[i].Name) {
				t.Errorf("param %d: %+v, layers.GPT has %+v", i, want[i], got[i])
			}
		}
	}
}

// Cutting the full parameters for every rank of a TP × EP grid and
// consolidating the cuts gives them back; a missing rank is named.
func TestShardConsolidate(t *testing.T) {
	c := layers.GPTConfig{Layers: 1, Dim: 8, Heads: 2, Vocab: 12, Seq: 4, FFN: 6, Experts: 4, TopK: 2, MoEEvery: 1}
	rng := rand.New(rand.NewPCG(1, 2))
	full := map[string]*tensor.Tensor{}
	for _, p := range Params(c) {
		v := make([]float32, tensor.Shape(p.Shape).Numel())
		for i := range v {
			v[i] = rng.Float32() - 0.5
		}
		full[p.Name], _ = tensor.FromFloat32(v, p.Shape...)
	}
	const TP, EP, W = 2, 4, 4
	var ranks []RankWeights
	for r := range W {
		pl := Placement{TP: TP, TPRank: r % TP, EP: EP, EPRank: r % EP}
		rw := RankWeights{Placement: pl, Tensors: map[string]*tensor.Tensor{}}
		for _, p := range Params(c) {
			local := slices.Clone(p.Shape)
			switch {
			case p.Expert:
				local[0] /= EP
			case p.Name == "embed.weight" || p.Name == "lm_head.weight" || slices.Contains([]string{"attn.wq", "attn.wk", "attn.wv"}, p.Name[9:min(len(p.Name), 16)]):
				local[0] /= TP
			case p.Name == "blocks.0.attn.wo.weight":
				local[1] /= TP
			}
			s, err := Shard(c, p.Name, full[p.Name], local, pl)
			if err != nil {
				t.Fatal(err)
			}
			rw.Tensors[p.Name] = s
		}
		ranks = append(ranks, rw)
	}
	got, err := Consolidate(c, ranks)
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range full {
		if !slices.Equal(got[n].F32(), want.F32()) {
			t.Errorf("%s differs after shard and consolidate", n)
		}
	}
	if _, err := Consolidate(c, ranks[:2]); err == nil {
		t.Error("consolidating 2 of the 4 ranks (experts 2 and 3 missing) succeeded")
	}
}
