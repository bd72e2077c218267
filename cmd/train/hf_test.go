package main

// Hugging Face interchange through the command: a model directory in the
// transformers layout, written here with the names and config fields of
// transformers (not hf's tables), starts runs at several layouts with the
// source model's loss; export merges TP and EP shards, and its directory
// starts a run again with the same loss.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/train"
)

const hfB, hfT = 4, 16

// hfModel is a random transformers model: its tensors by transformers
// name, and our GPT with the same function.
type hfModel struct {
	dir string
	ref *layers.GPT
}

func randT(rng *rand.Rand, std, mean float64, shape ...int) *tensor.Tensor {
	v := make([]float32, tensor.Shape(shape).Numel())
	for i := range v {
		v[i] = float32(mean + std*rng.NormFloat64())
	}
	t, _ := tensor.FromFloat32(v, shape...)
	return t
}

// writeHFModel writes a Llama (experts 0) or Mixtral directory with kv
// key/value heads and returns it with the reference model.
func writeHFModel(t *testing.T, experts, kv int, tied bool) hfModel {
	t.Helper()
	const L, C, H, V, F = 2, 32, 4, 256, 48
	D := C / H
	rng := rand.New(rand.NewPCG(uint64(experts), uint64(kv)))
	cfg := map[string]any{"model_type": "llama", "architectures": []string{"LlamaForCausalLM"}, "vocab_size": V,
		"hidden_size": C, "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
		"num_key_value_heads": kv, "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
		"rope_theta": 5000.0, "tie_word_embeddings": tied, "attention_bias": false, "rope_scaling": nil, "torch_dtype": "float32"}
	mc := layers.GPTConfig{Layers: L, Dim: C, Heads: H, KVHeads: kv, Vocab: V, Seq: hfT, FFN: F, TiedEmbeddings: tied, RopeTheta: 5000, NormEps: 1e-6}
	if experts > 0 {
		cfg["model_type"], cfg["architectures"] = "mixtral", []string{"MixtralForCausalLM"}
		cfg["num_local_experts"], cfg["num_experts_per_tok"] = experts, 2
		mc.Experts, mc.TopK, mc.MoEEvery = experts, 2, 1
	}
	ours := map[string]*tensor.Tensor{}
	var file []safetensors.Named
	put := func(hfName, our string, t *tensor.Tensor) {
		file = append(file, safetensors.Named{Name: hfName, Tensor: t})
		if our != "" {
			ours[our] = t
		}
	}
	put("model.embed_tokens.weight", "embed.weight", randT(rng, 0.5, 0, V, C))
	for l := range L {
		p, o := fmt.Sprintf("model.layers.%d.", l), fmt.Sprintf("blocks.%d.", l)
		put(p+"input_layernorm.weight", o+"attn_norm.weight", randT(rng, 0.1, 1, C))
		put(p+"post_attention_layernorm.weight", o+"mlp_norm.weight", randT(rng, 0.1, 1, C))
		put(p+"self_attn.q_proj.weight", o+"attn.wq.weight", randT(rng, 0.2, 0, C, C))
		put(p+"self_attn.o_proj.weight", o+"attn.wo.weight", randT(rng, 0.2, 0, C, C))
		for _, kvName := range []string{"k", "v"} { // grouped-query: kv heads, as they are
			put(p+"self_attn."+kvName+"_proj.weight", o+"attn.w"+kvName+".weight", randT(rng, 0.2, 0, kv*D, C))
		}
		if experts == 0 {
			put(p+"mlp.gate_proj.weight", o+"mlp.w_gate.weight", randT(rng, 0.2, 0, F, C))
			put(p+"mlp.up_proj.weight", o+"mlp.w_up.weight", randT(rng, 0.2, 0, F, C))
			put(p+"mlp.down_proj.weight", o+"mlp.w_down.weight", randT(rng, 0.2, 0, C, F))
			continue
		}
		put(p+"block_sparse_moe.gate.weight", o+"moe.router.weight", randT(rng, 0.3, 0, experts, C))
		for _, w := range []struct{ hf, our string }{{"w1", "w_gate"}, {"w3", "w_up"}, {"w2", "w_down"}} {
			var all []float32
			for e := range experts {
				shape := []int{F, C}
				if w.hf == "w2" {
					shape = []int{C, F}
				}
				et := randT(rng, 0.2, 0, shape...)
				put(p+"block_sparse_moe.experts."+strconv.Itoa(e)+"."+w.hf+".weight", "", et)
				all = append(all, et.F32()...)
			}
			shape := []int{experts, F, C}
			if w.hf == "w2" {
				shape = []int{experts, C, F}
			}
			ours[o+"moe."+w.our], _ = tensor.FromFloat32(all, shape...)
		}
	}
	put("model.norm.weight", "final_norm.weight", randT(rng, 0.1, 1, C))
	if !tied {
		put("lm_head.weight", "lm_head.weight", randT(rng, 0.3, 0, V, C))
	}
	dir := t.TempDir()
	js, _ := json.Marshal(cfg)
	os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644)
	f, _ := os.Create(filepath.Join(dir, "model.safetensors"))
	if err := safetensors.Write(f, file, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b := cpu.New()
	ref, err := layers.NewGPT(b, mc, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ref.Params().Params() {
		b.Upload(p.W, ours[p.Name])
	}
	return hfModel{dir: dir, ref: ref}
}

// batchFile writes B windows of T random tokens (B·T+1 ids) as a .bin:
// step 1's batch holds all of them, in some order, whatever the seed.
func batchFile(t *testing.T) (string, []int32) {
	rng := rand.New(rand.NewPCG(9, 9))
	ids := make([]int32, hfB*hfT+1)
	buf := make([]byte, 2*len(ids))
	for i := range ids {
		ids[i] = int32(rng.IntN(256))
		binary.LittleEndian.PutUint16(buf[2*i:], uint16(ids[i]))
	}
	p := filepath.Join(t.TempDir(), "batch.bin")
	os.WriteFile(p, buf, 0o644)
	return p, ids
}

// refLoss is the mean loss (cross-entropy, no aux) of m on the windows.
func refLoss(t *testing.T, m *layers.GPT, toks []int32) float64 {
	in, tg := make([]int32, hfB*hfT), make([]int32, hfB*hfT)
	for i := range in {
		w, p := i/hfT, i%hfT
		in[i], tg[i] = toks[w*hfT+p], toks[w*hfT+p+1]
	}
	it, _ := tensor.FromInt32(in, hfB, hfT)
	tt, _ := tensor.FromInt32(tg, hfB, hfT)
	l, err := m.Forward(it, tt)
	if err != nil {
		t.Fatal(err)
	}
	return l - m.AuxLoss()
}

func firstLoss(t *testing.T, out string) float64 {
	recs, err := train.ReadMetrics(filepath.Join(out, train.MetricsFile))
	if err != nil || len(recs) == 0 {
		t.Fatalf("%s: %v", out, err)
	}
	if a, ok := recs[0].Extra["aux_loss"].(float64); ok {
		return recs[0].Loss - a
	}
	return recs[0].Loss
}

func initArgs(dir, data, out string, extra ...string) []string {
	return append([]string{"--init-from", dir, "--data", data, "--batch", strconv.Itoa(hfB), "--seq", strconv.Itoa(hfT),
		"--steps", "1", "--val-fraction", "0", "--log-every", "100", "--out", out}, extra...)
}

func TestInitFromTransformersLayout(t *testing.T) {
	data, toks := batchFile(t)
	for _, c := range []struct {
		experts, kv int
		tied        bool
		layouts     [][]string
	}{
		{0, 2, false, [][]string{nil, {"--tp", "2"}}},
		{0, 4, true, [][]string{{"--dp", "2"}}},
		{4, 4, false, [][]string{nil, {"--dp", "2", "--ep", "2"}}},
	} {
		m := writeHFModel(t, c.experts, c.kv, c.tied)
		want := refLoss(t, m.ref, toks)
		for _, lay := range c.layouts {
			out := t.TempDir()
			o := mustRun(t, initArgs(m.dir, data, out, lay...)...)
			got := firstLoss(t, out)
			name := fmt.Sprintf("experts %d, kv heads %d, tied %v, layout %v", c.experts, c.kv, c.tied, lay)
			if math.Abs(got-want) > 1e-5*math.Abs(want) {
				t.Errorf("%s: step-1 loss %.7f, the source model's %.7f\n%s", name, got, want, o)
			} else {
				t.Logf("%s: step-1 loss %.7f, source %.7f", name, got, want)
			}
		}
	}
	// Mismatches are named: an explicit flag against the model's config, a
	// missing tensor, text data for a model with its own tokenizer.
	m := writeHFModel(t, 0, 4, true)
	if out, code := runMain(t, initArgs(m.dir, data, t.TempDir(), "--heads", "8")...); code == 0 || !strings.Contains(out, "heads: given 8, the model's 4") {
		t.Errorf("--heads 8 on a 4-head model: exit %d\n%s", code, out)
	}
	// TP splits the key/value heads: a TP size that does not divide them is
	// refused naming both (as Megatron does).
	gqa := writeHFModel(t, 0, 2, false)
	if out, code := runMain(t, initArgs(gqa.dir, data, t.TempDir(), "--tp", "4")...); code == 0 || !strings.Contains(out, "--tp 4 does not divide the model's kv-heads = 2") {
		t.Errorf("--tp 4 on a model of 2 key/value heads: exit %d\n%s", code, out)
	}
	os.WriteFile(filepath.Join(m.dir, "tokenizer.json"), []byte(`{"model": {}}`), 0o644)
	if out, code := runMain(t, "--init-from", m.dir, "--out", t.TempDir(), "--seq", "16", "--steps", "1"); code == 0 || !strings.Contains(out, "its own tokenizer") {
		t.Errorf("text data for a model with a tokenizer: exit %d\n%s", code, out)
	}
	os.Remove(filepath.Join(m.dir, "tokenizer.json"))
	var cfg map[string]any
	js, _ := os.ReadFile(filepath.Join(m.dir, "config.json"))
	json.Unmarshal(js, &cfg)
	cfg["num_hidden_layers"] = 3
	js, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(m.dir, "config.json"), js, 0o644)
	if out, code := runMain(t, initArgs(m.dir, data, t.TempDir())...); code == 0 || !strings.Contains(out, "model.layers.2.input_layernorm.weight is missing") {
		t.Errorf("a config of 3 layers over weights of 2: exit %d\n%s", code, out)
	}
}

// readST reads a safetensors file's tensors as float32 values by name.
func readST(t *testing.T, path string) map[string][]float32 {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sf, err := safetensors.Read(data)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for _, n := range sf.Names() {
		tt, _ := sf.Entries[n].Tensor()
		out[n] = tt.F32()
	}
	return out
}

// Export merges the shards: each exported tensor is the ranks' pieces put
// together by hand here (TP: wq rows and wo columns by TP rank; EP: the
// experts by EP rank); the exported directory starts a run whose step-1
// loss is the checkpoint's own loss on the batch (train logits).
func TestExportShardedRoundTrip(t *testing.T) {
	data, _ := batchFile(t)
	for _, c := range []struct {
		name string
		args []string
		rank func(r int, name string) (dim, lo int) // where rank r's piece of name goes
	}{
		{"tp 2", []string{"--tp", "2"}, func(r int, n string) (int, int) {
			switch {
			case strings.Contains(n, "self_attn.o_proj"), strings.Contains(n, "mlp.down_proj"):
				return 1, r
			case strings.Contains(n, "_proj"), n == "model.embed_tokens.weight", n == "lm_head.weight":
				return 0, r
			}
			return -1, 0
		}},
		{"ep 2 (MoE)", []string{"--experts", "4", "--dp", "2", "--ep", "2"}, nil},
		{"tp 2, grouped-query (4 heads, 2 kv heads)", []string{"--tp", "2", "--heads", "4", "--kv-heads", "2"}, func(r int, n string) (int, int) {
			switch {
			case strings.Contains(n, "self_attn.o_proj"), strings.Contains(n, "mlp.down_proj"):
				return 1, r
			case strings.Contains(n, "_proj"), n == "model.embed_tokens.weight", n == "lm_head.weight":
				return 0, r
			}
			return -1, 0
		}},
	} {
		run := t.TempDir()
		mustRun(t, append(small(run, "--steps", "3", "--tied=false", "--val-fraction", "0"), c.args...)...)
		exp := filepath.Join(t.TempDir(), "hf")
		o := mustRun(t, "export", "--from", run, "--out", exp)
		got := readST(t, filepath.Join(exp, "model.safetensors"))
		var cfg map[string]any
		js, _ := os.ReadFile(filepath.Join(exp, "config.json"))
		json.Unmarshal(js, &cfg)
		moe := c.rank == nil
		if cfg["model_type"] != map[bool]string{false: "llama", true: "mixtral"}[moe] || cfg["hidden_size"] != 32.0 || cfg["tie_word_embeddings"] != false {
			t.Errorf("%s: config.json %v", c.name, cfg)
		}
		heads, kvHeads := 2.0, 2.0
		if slices.Contains(c.args, "--kv-heads") {
			heads, kvHeads = 4, 2
		}
		if cfg["num_attention_heads"] != heads || cfg["num_key_value_heads"] != kvHeads || cfg["head_dim"] != 32/heads {
			t.Errorf("%s: config.json has %v heads, %v key/value heads of %v, want %v, %v of %v", c.name,
				cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], heads, kvHeads, 32/heads)
		}
		if _, err := os.Stat(filepath.Join(exp, "tokenizer.json")); err != nil {
			t.Errorf("%s: no byte-level tokenizer.json: %v\n%s", c.name, err, o)
		}
		ranks := []map[string][]float32{readST(t, filepath.Join(run, "rank-00000", "step-000003", "model.safetensors")),
			readST(t, filepath.Join(run, "rank-00001", "step-000003", "model.safetensors"))}
		check := func(hfName string, want []float32) {
			if g, ok := got[hfName]; !ok || !slices.Equal(g, want) {
				t.Errorf("%s: exported %s (present %v) differs from the ranks' pieces", c.name, hfName, ok)
			}
		}
		if moe {
			// Rank r (EP rank r) holds experts 2r, 2r+1 of blocks.0.moe.w_gate (2, 64, 32) etc.
			for _, w := range []struct{ our, hf string }{{"w_gate", "w1"}, {"w_up", "w3"}, {"w_down", "w2"}} {
				for r := range 2 {
					v := ranks[r]["blocks.0.moe."+w.our]
					per := len(v) / 2
					for e := range 2 {
						check(fmt.Sprintf("model.layers.0.block_sparse_moe.experts.%d.%s.weight", 2*r+e, w.hf), v[e*per:(e+1)*per])
					}
				}
			}
			check("model.layers.0.block_sparse_moe.gate.weight", ranks[0]["blocks.0.moe.router.weight"])
		} else {
			pieces := map[string]string{"model.layers.0.self_attn.q_proj.weight": "blocks.0.attn.wq.weight",
				"model.layers.0.self_attn.k_proj.weight": "blocks.0.attn.wk.weight", "model.layers.0.self_attn.v_proj.weight": "blocks.0.attn.wv.weight",
				"model.layers.0.self_attn.o_proj.weight": "blocks.0.attn.wo.weight", "model.layers.0.mlp.down_proj.weight": "blocks.0.mlp.w_down.weight",
				"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "final_norm.weight", "lm_head.weight": "lm_head.weight"}
			for hfName, our := range pieces {
				dim, _ := c.rank(0, hfName)
				var want []float32
				switch dim {
				case -1:
					want = ranks[0][our]
				case 0:
					want = append(slices.Clone(ranks[0][our]), ranks[1][our]...)
				case 1: // (32, 16) pieces side by side in (32, 32)
					n := len(ranks[0][our]) / 32
					for row := range 32 {
						want = append(want, ranks[0][our][row*n:(row+1)*n]...)
						want = append(want, ranks[1][our][row*n:(row+1)*n]...)
					}
				}
				check(hfName, want)
			}
		}
		// Back in: the exported directory starts a run (at another layout)
		// with the checkpoint's loss on the batch.
		lf := filepath.Join(t.TempDir(), "l.safetensors")
		mustRun(t, "logits", "--from", run, "--data", data, "--batch", strconv.Itoa(hfB), "--seq", strconv.Itoa(hfT), "--out", lf)
		want := float64(readST(t, lf)["loss"][0])
		for _, lay := range [][]string{nil, {"--tp", "2"}} {
			out := t.TempDir()
			mustRun(t, initArgs(exp, data, out, lay...)...)
			if got := firstLoss(t, out); math.Abs(got-want) > 1e-5*want {
				t.Errorf("%s → export → --init-from %v: step-1 loss %.7f, the checkpoint's %.7f", c.name, lay, got, want)
			}
		}
	}
}

// TestExportRunState: export reads a run of several ranks as a resume
// does (train.RunCheckpoints). A run of 4 ranks (TP 4) to step 2, resumed
// in its own out dir at 2 ranks (TP 2) to step 4, exports step 4 from the
// 2 ranks; once rank 1's checkpoint of step 4 is gone (a rank killed in
// the middle of its save: its latest is step 2 again) it exports the
// newest step every rank holds, step 2, from the 4 ranks that wrote it:
// tensor for tensor what the export of the run at step 2 wrote. One
// rank's checkpoint of a run of several is refused, naming the run's out
// dir.
func TestExportRunState(t *testing.T) {
	dir := trainRun(t, "--steps", "2", "--tp", "4")
	export := func(from string) (string, map[string][]float32) {
		t.Helper()
		exp := filepath.Join(t.TempDir(), "hf")
		o := mustRun(t, "export", "--from", from, "--out", exp)
		return o, readST(t, filepath.Join(exp, "model.safetensors"))
	}
	o2, want2 := export(dir)
	if !strings.Contains(o2, "at step 2 (4 checkpoint files)") {
		t.Fatalf("export of the run of 4 ranks at step 2:\n%s", o2)
	}
	if err := run(context.Background(), par(dir, "--steps", "4", "--tp", "2", "--resume", dir)); err != nil {
		t.Fatal(err)
	}
	o4, got4 := export(dir)
	if !strings.Contains(o4, "at step 4 (2 checkpoint files)") {
		t.Fatalf("export after the resume at 2 ranks to step 4:\n%s", o4)
	}
	if e := "model.embed_tokens.weight"; len(got4[e]) == 0 || slices.Equal(got4[e], want2[e]) {
		t.Fatalf("the export of step 4 holds step 2's weights")
	}
	os.RemoveAll(filepath.Join(train.RankDir(dir, 1), train.CheckpointName(4)))
	os.WriteFile(filepath.Join(train.RankDir(dir, 1), train.LatestFile), []byte(train.CheckpointName(2)+"\n"), 0o644)
	o, got := export(dir)
	if !strings.Contains(o, "at step 2 (4 checkpoint files)") {
		t.Fatalf("export once rank 1's step 4 is gone:\n%s", o)
	}
	if len(got) != len(want2) {
		t.Fatalf("exported %d tensors, the export of step 2 %d", len(got), len(want2))
	}
	for n, w := range want2 {
		if !slices.Equal(got[n], w) {
			t.Errorf("exported %s differs from the export of the run at step 2", n)
		}
	}
	one := filepath.Join(train.RankDir(dir, 0), train.CheckpointName(4))
	msg, code := runMain(t, "export", "--from", one, "--out", filepath.Join(t.TempDir(), "hf"))
	if code == 0 || !strings.Contains(msg, "one rank's checkpoint of a run of 2 ranks") {
		t.Fatalf("export from one rank's checkpoint: exit %d:\n%s", code, msg)
	}
}

// TestExportDistributedOptimizer: the checkpoints of a distributed
// optimizer hold runs of the parameters (train.RunsKey), spread over the
// replicas; export puts them together into the same tensors, bit for bit,
// as it exports from the same run with the replicated optimizer (no
// clipping: the two runs' updates are the same elementwise arithmetic on
// the same gradients), at TP 2 × DP 2 and for an MoE model at DP 2 × EP 2
// (the experts' runs over their EDP group).
func TestExportDistributedOptimizer(t *testing.T) {
	export := func(dir string) map[string][]float32 {
		t.Helper()
		exp := filepath.Join(t.TempDir(), "hf")
		mustRun(t, "export", "--from", dir, "--out", exp)
		return readST(t, filepath.Join(exp, "model.safetensors"))
	}
	for _, l := range [][]string{{"--tp", "2", "--dp", "2"}, append([]string{"--dp", "2", "--ep", "2"}, moe...)} {
		args := append([]string{"--steps", "2", "--grad-clip", "0"}, l...)
		dist := trainRun(t, append(args, "--distributed-optimizer")...)
		sf, err := safetensors.ReadFile(filepath.Join(train.RankDir(dist, 1), train.CheckpointName(2), train.ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := sf.Metadata[train.RunsKey]; !ok {
			t.Fatalf("%v: rank 1's checkpoint records no runs (%s): nothing to put together", l, train.RunsKey)
		}
		got, want := export(dist), export(trainRun(t, args...))
		if len(got) != len(want) {
			t.Fatalf("%v: exported %d tensors, %d with the replicated optimizer", l, len(got), len(want))
		}
		for n, w := range want {
			if !slices.Equal(got[n], w) {
				t.Errorf("%v: exported %s differs from the replicated optimizer's", l, n)
			}
		}
	}
}
