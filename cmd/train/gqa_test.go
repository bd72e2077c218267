package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/train"
)

// A grouped-query model (--kv-heads 2 for 4 heads) trains at TP 1 and TP 2
// (with and without sequence parallelism) to the same losses within the
// parallel runs' tolerance; its checkpoints keep it grouped-query (each TP
// rank's wk is its key/value head's 8 rows), a resume continues it bit for
// bit, and a resume that asks for other key/value heads is refused naming
// them.
func TestKVHeadsRun(t *testing.T) {
	gqa := []string{"--kv-heads", "2", "--steps", "4", "--checkpoint-every", "2"}
	one := trainRun(t, gqa...)
	want := metrics(t, one)
	for _, lay := range [][]string{{"--tp", "2"}, {"--tp", "2", "--sequence-parallel"}} {
		got := metrics(t, trainRun(t, append(gqa, lay...)...))
		for i, g := range got {
			if e := relErr(g.Loss, want[i].Loss); !(e <= 1e-5) {
				t.Fatalf("%v step %d: loss %v, TP 1's %v (relative error %.3g)", lay, g.Step, g.Loss, want[i].Loss, e)
			}
		}
	}
	if cfg := readConfig(t, one); cfg.Model.KVHeads != 2 || cfg.Model.Heads != 4 {
		t.Fatalf("config.json: %+v; want 4 heads, 2 key/value heads", cfg.Model)
	}
	tp := trainRun(t, append(gqa, "--tp", "2")...)
	for r := range 2 {
		data, err := os.ReadFile(filepath.Join(train.RankDir(tp, r), train.CheckpointName(4), train.ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		sf, err := safetensors.Read(data)
		if err != nil {
			t.Fatal(err)
		}
		if e := sf.Entries["blocks.0.attn.wk.weight"]; e == nil || len(e.Shape) != 2 || e.Shape[0] != 8 || e.Shape[1] != 32 {
			t.Fatalf("rank %d's checkpoint: wk %+v, want (8, 32): one key/value head of 8", r, e)
		}
	}
	// Back to step 2 and on: the same losses bit for bit.
	os.WriteFile(filepath.Join(one, train.LatestFile), []byte(train.CheckpointName(2)+"\n"), 0o644)
	resumed := trainRun(t, "--steps", "4", "--resume", one)
	got := metrics(t, resumed)
	if len(got) != 2 || got[0].Loss != want[2].Loss || got[1].Loss != want[3].Loss {
		t.Fatalf("resumed from step 2: %+v, want the losses of steps 3 and 4 %v, %v", got, want[2].Loss, want[3].Loss)
	}
	if out, code := runMain(t, par(t.TempDir(), "--steps", "4", "--kv-heads", "4", "--resume", one)...); code == 0 || !strings.Contains(out, "kv_heads: given 4, the checkpoint's 2") {
		t.Fatalf("resume with --kv-heads 4 of a 2-kv-head model: exit %d\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--heads", "4", "--kv-heads", "3"}, "--kv-heads 3: expected a divisor of --heads 4"},
		{[]string{"--heads", "4", "--kv-heads", "-2"}, "--kv-heads -2: expected a divisor of --heads 4"},
		{[]string{"--heads", "4", "--kv-heads", "8"}, "--kv-heads 8: expected a divisor of --heads 4"},
		{[]string{"--dim", "60", "--heads", "8"}, "--heads 8: expected a divisor of --dim 60"},
		{[]string{"--dim", "36", "--heads", "4"}, "--dim 36 over --heads 4: head dim 9, expected an even head dim"},
	} {
		if _, err := loadConfig(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%v: %v, want a refusal saying %q", tc.args, err, tc.want)
		}
	}
	// The start names the key/value heads when they are fewer than the heads.
	for _, tc := range []struct {
		kv   int
		want string
	}{{0, "4 heads, vocab"}, {4, "4 heads, vocab"}, {2, "4 heads (2 key/value), vocab"}, {1, "4 heads (1 key/value), vocab"}} {
		mc := layers.GPTConfig{Layers: 1, Dim: 32, Heads: 4, KVHeads: tc.kv, Vocab: 256, Seq: 16}
		if got := modelLine("tiny", mc, paramCount(mc.WithDefaults())); !strings.Contains(got, tc.want) {
			t.Fatalf("kv heads %d: %q, want it to say %q", tc.kv, got, tc.want)
		}
	}
	if out := mustRun(t, par(t.TempDir(), "--kv-heads", "2", "--steps", "2")...); !strings.Contains(out, "4 heads (2 key/value)") {
		t.Fatalf("the start of a run with --kv-heads 2 of 4 heads does not name them:\n%s", out)
	}
	if err := run(context.Background(), par(t.TempDir(), "--kv-heads", "1", "--tp", "2")); err == nil || !strings.Contains(err.Error(), "--tp 2 does not divide the model's kv-heads = 1") {
		t.Fatalf("--tp 2 over 1 key/value head: %v, want a refusal naming both", err)
	}
}
