package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/tokens/tokenstest"
)

// tinyData is a model and run small enough to train on every data format
// in CI: two steps of a one-layer model of width 16.
func tinyData(out string, extra ...string) []string {
	args := []string{"--layers", "1", "--dim", "16", "--heads", "2", "--seq", "16", "--batch", "2",
		"--steps", "2", "--warmup", "0", "--log-every", "100", "--eval-every", "2", "--eval-batches", "1", "--out", out}
	return append(args, extra...)
}

// phrase is a learnable stream of n ids below vocab that holds every one of
// edges: a repeated random phrase.
func phrase(rng *rand.Rand, n int, vocab int64, edges ...int64) []int64 {
	p := make([]int64, 29)
	for i := range p {
		p[i] = rng.Int64N(vocab)
	}
	copy(p, edges)
	out := make([]int64, n)
	for i := range out {
		out[i] = p[i%len(p)]
	}
	return out
}

// A two-step run on each data format, detected and given by --data-format,
// of one file and of several; ids past 65 535 (a Megatron int32 dataset of
// a 70 000-id vocabulary among them) train with --vocab 70000 and are
// refused with a smaller one.
func TestDataFormatsTrain(t *testing.T) {
	dir := t.TempDir()
	at := func(name string) string { return filepath.Join(dir, name) }
	rng := rand.New(rand.NewPCG(28, 9))
	small := phrase(rng, 700, 512, 0, 511)
	wide := phrase(rng, 900, 70000, 65535, 65536, 69999)
	text := []byte(strings.Repeat("the mapped corpus reads as one stream. ", 20))
	tokenstest.WriteFile(t, at("corpus.txt"), text)
	tokenstest.WriteFile(t, at("small.bin"), tokenstest.Raw(small, 2))
	tokenstest.WriteFile(t, at("wide.u32"), tokenstest.Raw(wide, 4))
	tokenstest.WriteFile(t, at("wide.dat"), tokenstest.Raw(wide, 4))
	tokenstest.WriteFile(t, at("gpt2_000.bin"), tokenstest.LLMC(small, 2))
	tokenstest.WriteFile(t, at("llama3_000.bin"), tokenstest.LLMC(wide, 4))
	tokenstest.WriteMegatron(t, at("meg_text_document"), [][]int64{small[:300], small[300:]}, 8)
	tokenstest.WriteMegatron(t, at("meg70k_text_document"), [][]int64{wide[:123], wide[123:500], wide[500:]}, 4)
	shards := at("shards")
	if err := os.Mkdir(shards, 0o755); err != nil {
		t.Fatal(err)
	}
	tokenstest.WriteFile(t, filepath.Join(shards, "s_000.bin"), tokenstest.LLMC(wide[:400], 4))
	tokenstest.WriteFile(t, filepath.Join(shards, "s_001.bin"), tokenstest.LLMC(small, 2))
	tokenstest.WriteMegatron(t, filepath.Join(shards, "s_002"), [][]int64{wide[:300]}, 4)

	for _, c := range []struct {
		name string
		args []string
	}{
		{"text", []string{"--data", at("corpus.txt")}},
		{"raw uint16", []string{"--data", at("small.bin"), "--vocab", "512"}},
		{"raw uint32", []string{"--data", at("wide.u32"), "--vocab", "70000"}},
		{"raw uint32 by --data-format", []string{"--data", at("wide.dat"), "--data-format", "uint32", "--vocab", "70000"}},
		{"llm.c uint16", []string{"--data", at("gpt2_000.bin"), "--vocab", "512"}},
		{"llm.c uint32", []string{"--data", at("llama3_000.bin"), "--data-format", "llmc", "--vocab", "70000"}},
		{"megatron uint16", []string{"--data", at("meg_text_document"), "--vocab", "512"}},
		{"megatron int32, vocabulary 70000", []string{"--data", at("meg70k_text_document"), "--data-format", "megatron", "--vocab", "70000", "--val-fraction", "0.2"}},
		{"list", []string{"--data", at("small.bin") + "," + at("gpt2_000.bin") + "," + at("meg_text_document.idx"), "--vocab", "512"}},
		{"directory", []string{"--data", shards, "--vocab", "70000"}},
		{"glob, with --val-data", []string{"--data", filepath.Join(shards, "s_00[01].bin"), "--val-data", at("meg70k_text_document.bin"), "--vocab", "70000"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			if err := run(context.Background(), tinyData(out, c.args...)); err != nil {
				t.Fatal(err)
			}
			if l := readLosses(t, filepath.Join(out, "metrics.jsonl")); len(l) != 2 || !(l[2] > 0) {
				t.Fatalf("metrics.jsonl holds the losses %v, want two", l)
			}
		})
	}
	o, code := runMain(t, tinyData(t.TempDir(), "--data", at("meg70k_text_document"), "--vocab", "65536")...)
	if code == 0 || !strings.Contains(o, "meg70k_text_document.bin") || !strings.Contains(o, "65536 ids") {
		t.Errorf("ids past 65 535 with --vocab 65536: exit %d\n%s", code, o)
	}
	o = mustRun(t, tinyData(t.TempDir(), "--data", shards, "--vocab", "70000")...)
	if !strings.Contains(o, "data: "+shards+" (3 files: llm.c uint32, llm.c uint16, megatron int32)") {
		t.Errorf("the start-up line does not name the files' formats:\n%s", o)
	}
}

// A run over several files of mapped ids resumes exactly: the same losses
// as one run.
func TestDataResumesExactly(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(28, 10))
	v := phrase(rng, 1500, 70000, 65536, 69999)
	tokenstest.WriteFile(t, filepath.Join(dir, "a.u32"), tokenstest.Raw(v[:700], 4))
	tokenstest.WriteMegatron(t, filepath.Join(dir, "b"), [][]int64{v[700:1000], v[1000:]}, 4)
	data := filepath.Join(dir, "a.u32") + "," + filepath.Join(dir, "b")
	full, half, resumed := t.TempDir(), t.TempDir(), t.TempDir()
	args := func(out string, extra ...string) []string {
		return tinyData(out, append([]string{"--data", data, "--vocab", "70000", "--steps", "6", "--batch", "4"}, extra...)...)
	}
	for _, a := range [][]string{args(full), args(half, "--checkpoint-every", "3"), args(resumed, "--resume", filepath.Join(half, "step-000003"))} {
		if err := run(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}
	a := readLosses(t, filepath.Join(full, "metrics.jsonl"))
	b := readLosses(t, filepath.Join(resumed, "metrics.jsonl"))
	for s := 4; s <= 6; s++ {
		if a[s] == 0 || a[s] != b[s] {
			t.Fatalf("step %d: loss %v after resume, %v in one run", s, b[s], a[s])
		}
	}
}

// --val-data: a validation set of its own in place of the preset's
// held-out split (config.json says so), refused beside an explicit
// --val-fraction, of another kind than the training data, or too short;
// --data-format: a known format, with files to read.
func TestValData(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(28, 11))
	trainIDs, valIDs := phrase(rng, 600, 512), phrase(rng, 200, 512)
	tr, va := filepath.Join(dir, "train.bin"), filepath.Join(dir, "val.bin")
	tokenstest.WriteFile(t, tr, tokenstest.Raw(trainIDs, 2))
	tokenstest.WriteFile(t, va, tokenstest.Raw(valIDs, 2))
	text := filepath.Join(dir, "val.txt")
	tokenstest.WriteFile(t, text, []byte(strings.Repeat("text ", 40)))
	short := filepath.Join(dir, "short.bin")
	tokenstest.WriteFile(t, short, tokenstest.Raw(valIDs[:10], 2))
	v2 := filepath.Join(dir, "v2.bin") // an llm.c magic with version 2
	tokenstest.WriteFile(t, v2, append(tokenstest.LLMCHeader(20240520, 2, 600), tokenstest.Raw(trainIDs, 2)...))

	out := t.TempDir()
	// --val-fraction 0 with --val-data: the evaluation flags take effect.
	o := mustRun(t, tinyData(out, "--data", tr, "--val-data", va, "--vocab", "512", "--val-fraction", "0")...)
	if !strings.Contains(o, "val_loss") && !strings.Contains(o, "validation loss") {
		t.Errorf("no validation loss in the output:\n%s", o)
	}
	if cfg := readConfig(t, out); cfg.ValData != va || cfg.Train.ValFraction != 0 {
		t.Errorf("config.json: val_data %q, val_fraction %v; want %q and 0", cfg.ValData, cfg.Train.ValFraction, va)
	}
	// The validation loss is the one of val.bin: the same run with
	// train.bin as its validation set gives another.
	if a, b := valLosses(t, out), valLosses(t, runOut(t, "--data", tr, "--val-data", tr, "--vocab", "512")); len(a) == 0 || a[2] == b[2] {
		t.Errorf("validation losses %v on val.bin and %v on train.bin", a, b)
	}

	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"with --val-fraction", []string{"--data", tr, "--val-data", va, "--val-fraction", "0.1", "--vocab", "512"}, []string{"--val-data", "--val-fraction 0.1", "not both"}},
		{"of another kind", []string{"--data", tr, "--val-data", text, "--vocab", "512"}, []string{"val.txt", "text", "token ids"}},
		{"too short", []string{"--data", tr, "--val-data", short, "--vocab", "512"}, []string{"--val-data", "short.bin", "fewer than seq+1"}},
		{"missing", []string{"--data", tr, "--val-data", filepath.Join(dir, "nope.bin"), "--vocab", "512"}, []string{"nope.bin", "does not exist"}},
		{"without eval steps", []string{"--data", tr, "--val-data", va, "--vocab", "512", "--eval-every", "0"}, []string{"--eval-every"}},
		{"unknown format", []string{"--data", tr, "--data-format", "arrow"}, []string{"arrow", "unknown data format"}},
		{"format without files", []string{"--data-format", "uint16"}, []string{"--data-format uint16", "built-in corpus"}},
		// What a format given explicitly would read: the package's error, and the flag that gives it.
		{"text with ids", []string{"--data", text + "," + tr, "--vocab", "512"}, []string{"--data: ", "val.txt", "train.bin", "mixes text", "give it with --data-format"}},
		{"validation text with ids", []string{"--data", tr, "--val-data", va + "," + text, "--vocab", "512"}, []string{"--val-data: ", "mixes text", "give it with --data-format"}},
		{"llm.c magic, other version", []string{"--data", v2, "--vocab", "512"}, []string{"--data: ", "v2.bin", "version 2", "give it with --data-format uint16 or uint32"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, code := runMain(t, tinyData(t.TempDir(), c.args...)...)
			if code == 0 {
				t.Fatalf("exit 0, want an error saying %q:\n%s", c.want, o)
			}
			for _, w := range c.want {
				if !strings.Contains(o, w) {
					t.Fatalf("the error does not say %q:\n%s", w, o)
				}
			}
		})
	}
}

func runOut(t *testing.T, args ...string) string {
	t.Helper()
	out := t.TempDir()
	if err := run(context.Background(), tinyData(out, args...)); err != nil {
		t.Fatal(err)
	}
	return out
}

func valLosses(t *testing.T, out string) map[int]float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	v := map[int]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Step    int      `json:"step"`
			ValLoss *float64 `json:"val_loss"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.ValLoss != nil {
			v[r.Step] = *r.ValLoss
		}
	}
	return v
}

// "train tokens" writes a text's bytes, offset, as ids in each format;
// they read back as those ids, and it never overwrites a file.
func TestTokensCommand(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")
	tokenstest.WriteFile(t, a, []byte("first document"))
	tokenstest.WriteFile(t, b, []byte("and the second one"))
	want := func(offset int) []int32 {
		var v []int32
		for _, c := range []byte("first documentand the second one") {
			v = append(v, int32(c)+int32(offset))
		}
		return v
	}
	for _, c := range []struct {
		format, out string
		offset      int
		width       string
		detected    string
	}{
		{"uint16", "out/t.bin", 0, "", "raw uint16"},
		{"uint32", "out/t.u32", 65536, "", "raw uint32"},
		{"llmc", "out/l.bin", 1000, "", "llm.c uint16"},
		{"llmc", "out/l32.bin", 65500, "", "llm.c uint32"},
		{"megatron", "out/m", 7, "4", "megatron int32"},
		{"megatron", "out/m16", 7, "", "megatron uint16"},
	} {
		out := filepath.Join(dir, c.out)
		args := []string{"--format", c.format, "--out", out, "--offset", strconv.Itoa(c.offset)}
		if c.width != "" {
			args = append(args, "--width", c.width)
		}
		if err := runTokens(append(args, a, b)); err != nil {
			t.Fatalf("%s: %v", c.out, err)
		}
		s, err := tokens.Open(out, tokens.Auto)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]int32, s.Len())
		if err := s.Read(got, 0); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want(c.offset)) || !strings.Contains(s.Name(), c.detected) {
			t.Errorf("%s (%s): ids %v, want %v", c.out, s.Name(), got, want(c.offset))
		}
		s.Close()
		if err := runTokens(append(args, a)); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Errorf("%s written again: %v, want a refusal", c.out, err)
		}
	}
	for _, bad := range [][]string{
		{"--format", "parquet", "--out", filepath.Join(dir, "x"), a},
		{"--format", "uint16", "--offset", "65500", "--out", filepath.Join(dir, "y"), a},
		{"--format", "uint32", "--width", "2", "--out", filepath.Join(dir, "z"), a},
		{"--format", "uint16", a},
	} {
		if err := runTokens(bad); err == nil {
			t.Errorf("train tokens %q: no error", bad)
		}
	}
}
