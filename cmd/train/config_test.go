package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigLayers(t *testing.T) {
	// File overrides the preset; flags override the file.
	p := writeConfig(t, `{"preset": "tiny", "model": {"dim": 96, "heads": 6}, "train": {"steps": 7, "lr": 0.01}}`)
	cfg, err := loadConfig([]string{"--config", p, "--steps", "9"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model.Dim != 96 || cfg.Model.Heads != 6 || cfg.Model.Layers != 2 {
		t.Errorf("model %+v: want the file's dim 96 and heads 6 over the preset's 2 layers", cfg.Model)
	}
	if cfg.Train.Steps != 9 || cfg.Train.LR != 0.01 {
		t.Errorf("train steps %d lr %v: want the flag's 9 steps and the file's lr 0.01", cfg.Train.Steps, cfg.Train.LR)
	}
	if cfg.Train.Seq != cfg.Model.Seq {
		t.Errorf("train seq %d differs from model seq %d", cfg.Train.Seq, cfg.Model.Seq)
	}
	// --model beats the file's preset.
	cfg, err = loadConfig([]string{"--config", writeConfig(t, `{"preset": "gpt2-124m"}`), "--model", "tiny"})
	if err != nil || cfg.Preset != "tiny" || cfg.Model.Dim != 64 {
		t.Fatalf("--model tiny over a gpt2-124m file: preset %q dim %d err %v", cfg.Preset, cfg.Model.Dim, err)
	}
	cfg, err = loadConfig([]string{"--model", "gpt2-124m"})
	if err != nil || cfg.Model.Layers != 12 || cfg.Model.Dim != 768 || cfg.Model.Heads != 12 || cfg.Model.Seq != 1024 {
		t.Fatalf("gpt2-124m preset: %+v, %v", cfg.Model, err)
	}
}

func TestConfigErrors(t *testing.T) {
	for body, want := range map[string]string{
		`{"model": {"dim": -4}}`:        "dim",
		`{"train": {"steps": 0.5}}`:     "steps",
		`{"train": {"lr": -1}}`:         "lr",
		`{"preset": "nope"}`:            "nope",
		`[]`:                            "",
		`{"model": {"heads": 3}}`:       "heads",
		`{"device": "gpu"}`:             "gpu",
		`{"model": {"vocab": 0}} trail`: "",
	} {
		_, err := loadConfig([]string{"--config", writeConfig(t, body)})
		if err == nil {
			t.Errorf("%s: no error", body)
			continue
		}
		if !strings.Contains(strings.ToLower(err.Error()), want) {
			t.Errorf("%s: error %q does not mention %q", body, err, want)
		}
	}
}

// FuzzConfig feeds arbitrary bytes to the --config reader: it must return a
// config or an error, never panic, and an accepted config must validate.
func FuzzConfig(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"preset": "tiny"}`, `{"model": {"layers": 3, "dim": 48, "heads": 3}}`,
		`{"train": {"steps": 5, "batch": 2, "lr": 0.1, "warmup": 9}}`, `{"model": {"seq": 1e9}}`,
		`{"data": "x.bin", "device": "cpu"}`, `null`, `{"model": null}`, `{"train": {"min_lr": 1e300}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p := filepath.Join(t.TempDir(), "c.json")
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig([]string{"--config", p})
		if err != nil {
			return
		}
		if err := cfg.Model.WithDefaults().Validate(); err != nil {
			t.Fatalf("accepted a config whose model does not validate: %v", err)
		}
		if err := cfg.Train.Validate(); err != nil {
			t.Fatalf("accepted a config whose training does not validate: %v", err)
		}
	})
}

// TestMemoryReportFlag: --memory-report turns the CUDA backend's ledger on
// for the run (not a config field: it is not written to config.json).
func TestMemoryReportFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, false}, {[]string{"--memory-report"}, true}} {
		cfg, err := loadConfig(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.memReport != tc.want {
			t.Errorf("loadConfig(%q): memReport %v, want %v", tc.args, cfg.memReport, tc.want)
		}
	}
	// Where it would do nothing, it is refused before any work.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory-report", "--device", "cpu"}, "found --device cpu"},
		{[]string{"--memory-report", "--tp", "2"}, "expected a run of one rank in one process, or GPU processes"},
		{[]string{"--memory-report", "--nproc", "2"}, "--memory-report: expected"},
	} {
		if _, err := loadConfig(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("loadConfig(%q): %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	// GPU processes keep a ledger each (rank 0 prints its own).
	args := []string{"--memory-report", "--nproc", "2", "--comm", "nvshmem", "--dp", "2", "--distributed-optimizer"}
	if cfg, err := loadConfig(args); err != nil || !cfg.memReport {
		t.Errorf("loadConfig(%q): %v, want a run with its ledger", args, err)
	}
}

// A field given explicitly that the run cannot use is refused, naming it:
// train.seq (the sequences are the model's), the MoE fields on a dense
// model, the evaluation's fields with nothing held out. The config.json a
// run writes names every field, so it must still load, with any flag
// over it.
func TestConfigFieldsWithoutEffect(t *testing.T) {
	for _, tc := range []struct {
		body string
		args []string
		want string
	}{
		{`{"train": {"seq": 32}}`, nil, "train.seq 32 cannot take effect"},
		{`{"model": {"seq": 128}, "train": {"seq": 64}}`, nil, "model.seq 128"},
		{`{"model": {"top_k": 4}}`, nil, "model.top_k 4 cannot take effect"},
		{`{"model": {"aux_loss_coef": 0.5}}`, nil, "model.aux_loss_coef"},
		{`{"train": {"val_fraction": 0, "eval_every": 7}}`, nil, "train.eval_every 7"},
		{`{}`, []string{"--topk", "2"}, "--topk 2 cannot take effect"},
		{`{}`, []string{"--capacity-factor", "1.5"}, "--capacity-factor"},
		{`{}`, []string{"--val-fraction", "0", "--eval-batches", "3"}, "--eval-batches 3"},
		{`{}`, []string{"--autotune-cache", "x.json"}, "--autotune-cache x.json cannot take effect"},
		{`{}`, []string{"--comm-timeout", "1m"}, "--comm-timeout 1m0s cannot take effect"},
		{`{"parallel": {"comm_timeout": "2m"}}`, nil, "parallel.comm_timeout 2m0s"},
	} {
		_, err := loadConfig(append([]string{"--config", writeConfig(t, tc.body)}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %q: %v, want an error containing %q", tc.body, tc.args, err, tc.want)
		}
	}
	// Used where they take effect.
	for _, tc := range []struct {
		body string
		args []string
	}{
		{`{"model": {"seq": 32}, "train": {"seq": 32}}`, nil},
		{`{"model": {"seq": 32}, "train": {"seq": 32}}`, []string{"--seq", "16"}},
		{`{"model": {"experts": 4, "top_k": 1}}`, nil},
		{`{}`, []string{"--experts", "4", "--topk", "1", "--aux-loss-coef", "0.1"}},
		{`{}`, []string{"--model", "tiny-moe", "--topk", "1"}},
		{`{"train": {"eval_every": 7}}`, nil},
		{`{"train": {"val_fraction": 0, "eval_every": 20, "eval_batches": 4}}`, nil}, // the preset's values, as config.json repeats them
		{`{}`, []string{"--overlap", "auto", "--autotune-cache", "x.json"}},
		{`{}`, []string{"--tp", "2", "--comm-timeout", "1m"}},
		{`{}`, []string{"--nproc", "2", "--comm-timeout", "1m"}},
	} {
		if _, err := loadConfig(append([]string{"--config", writeConfig(t, tc.body)}, tc.args...)); err != nil {
			t.Errorf("%s %q: %v, want it accepted", tc.body, tc.args, err)
		}
	}
	// A run's own config.json loads back.
	d := t.TempDir()
	if err := run(context.Background(), small(d, "--val-fraction", "0")); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig([]string{"--config", filepath.Join(d, "config.json"), "--out", t.TempDir(), "--seq", "8"}); err != nil {
		t.Fatalf("the run's config.json with --seq 8: %v", err)
	}
}
