package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the tests run the real command (main, with its exit code) by
// re-executing the test binary with ASYNCTP_TRAIN_MAIN=1. The variable is
// then set in the test process too, so that the ranks that --nproc's
// launcher starts from a test (the test binary itself) run the command.
func TestMain(m *testing.M) {
	if os.Getenv("ASYNCTP_TRAIN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Setenv("ASYNCTP_TRAIN_MAIN", "1")
	os.Exit(m.Run())
}

// runMain runs the command in a child process and returns its combined output
// and exit code.
func runMain(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ASYNCTP_TRAIN_MAIN=1")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// small is a model and run small enough for a test: a few seconds on 2 cores.
func small(out string, extra ...string) []string {
	args := []string{"--layers", "1", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "4",
		"--steps", "8", "--warmup", "2", "--log-every", "100", "--out", out}
	return append(args, extra...)
}

func readLosses(t *testing.T, path string) map[int]float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	losses := map[int]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec struct {
			Step int     `json:"step"`
			Loss float64 `json:"loss"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		losses[rec.Step] = rec.Loss
	}
	return losses
}

func TestDefaultsTrainAndWriteOutputs(t *testing.T) {
	out := t.TempDir()
	if err := run(context.Background(), small(out)); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"metrics.jsonl", "loss.png", "config.json", "latest"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing output %s: %v", f, err)
		}
	}
	losses := readLosses(t, filepath.Join(out, "metrics.jsonl"))
	if len(losses) != 8 {
		t.Fatalf("metrics.jsonl has %d steps, want 8", len(losses))
	}
	// config.json is a valid --config: rerunning from it reproduces the run.
	out2 := t.TempDir()
	if err := run(context.Background(), []string{"--config", filepath.Join(out, "config.json"), "--out", out2}); err != nil {
		t.Fatal(err)
	}
	again := readLosses(t, filepath.Join(out2, "metrics.jsonl"))
	for s, l := range losses {
		if again[s] != l {
			t.Fatalf("step %d: loss %v from config.json, %v originally", s, again[s], l)
		}
	}
}

func TestResumeGivesIdenticalLosses(t *testing.T) {
	full, half := t.TempDir(), t.TempDir()
	if err := run(context.Background(), small(full, "--steps", "10")); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), small(half, "--steps", "10", "--checkpoint-every", "5", "--log-every", "3")); err != nil {
		t.Fatal(err)
	}
	// Resume the second run from its step-5 checkpoint, into a fresh out dir.
	resumed := t.TempDir()
	if err := run(context.Background(), small(resumed, "--steps", "10", "--resume", filepath.Join(half, "step-000005"))); err != nil {
		t.Fatal(err)
	}
	a := readLosses(t, filepath.Join(full, "metrics.jsonl"))
	b := readLosses(t, filepath.Join(resumed, "metrics.jsonl"))
	for s := 6; s <= 10; s++ {
		if a[s] == 0 || a[s] != b[s] {
			t.Fatalf("step %d: loss %v after resume, %v in one run", s, b[s], a[s])
		}
	}
}

func TestBadInputFailsClearly(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	badJSON := filepath.Join(dir, "bad.json")
	os.WriteFile(badJSON, []byte(`{"model": {"layers": 2,}`), 0o644)
	unknownField := filepath.Join(dir, "unknown.json")
	os.WriteFile(unknownField, []byte(`{"model": {"layerz": 2}}`), 0o644)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"missing data", small(t.TempDir(), "--data", filepath.Join(dir, "nope.txt")), "nope.txt"},
		{"empty data", small(t.TempDir(), "--data", empty), "empty"},
		{"heads do not divide width", small(t.TempDir(), "--heads", "5"), "heads"},
		{"unknown preset", []string{"--model", "gpt5"}, "unknown model preset"},
		{"unknown flag", []string{"--nonsense"}, "nonsense"},
		{"stray argument", []string{"extra"}, "unexpected argument"},
		{"bad config JSON", []string{"--config", badJSON}, "bad.json"},
		{"unknown config field", []string{"--config", unknownField}, "layerz"},
		{"missing config", []string{"--config", filepath.Join(dir, "none.json")}, "none.json"},
		{"bad device", []string{"--device", "tpu"}, "tpu"},
		{"resume from nothing", small(t.TempDir(), "--resume", filepath.Join(dir, "no-such-run")), "no-such-run"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := runMain(t, c.args...)
			if code == 0 {
				t.Fatalf("exit code 0, want non-zero; output:\n%s", out)
			}
			if !strings.Contains(strings.ToLower(out), strings.ToLower(c.want)) {
				t.Fatalf("output does not mention %q:\n%s", c.want, out)
			}
		})
	}
}

func TestCorruptCheckpointIsRejectedAndKept(t *testing.T) {
	out := t.TempDir()
	if err := run(context.Background(), small(out, "--steps", "4")); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(out, "step-000004")
	model := filepath.Join(ckpt, "model.safetensors")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]byte{
		"truncated": data[:len(data)/2],
		"flipped":   append(append([]byte{}, data[:len(data)-3]...), data[len(data)-3]^0xff, data[len(data)-2], data[len(data)-1]),
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(model, bad, 0o644); err != nil {
				t.Fatal(err)
			}
			msg, code := runMain(t, small(t.TempDir(), "--steps", "8", "--resume", ckpt)...)
			if code == 0 || !strings.Contains(msg, "model.safetensors") {
				t.Fatalf("exit %d, output:\n%s", code, msg)
			}
			got, _ := os.ReadFile(model)
			if string(got) != string(bad) {
				t.Fatal("the checkpoint file was changed by the failed resume")
			}
		})
	}
}

func TestNaNLossStopsAndKeepsLastGoodCheckpoint(t *testing.T) {
	out := t.TempDir()
	if err := run(context.Background(), small(out, "--steps", "4", "--checkpoint-every", "2")); err != nil {
		t.Fatal(err)
	}
	// Poison the step-4 weights with NaN and re-sign the file, as a run whose
	// weights went bad without the checksum noticing would look.
	ck4 := filepath.Join(out, "step-000004")
	poisonWeights(t, ck4)
	resumed := t.TempDir()
	msg, code := runMain(t, small(resumed, "--steps", "8", "--checkpoint-every", "1", "--resume", ck4)...)
	if code == 0 {
		t.Fatalf("exit code 0 with NaN weights; output:\n%s", msg)
	}
	if !strings.Contains(msg, "NaN") || !strings.Contains(msg, "at step 5") {
		t.Fatalf("error does not say the loss is NaN at step 5:\n%s", msg)
	}
	if entries, _ := filepath.Glob(filepath.Join(resumed, "step-*")); len(entries) != 0 {
		t.Fatalf("a checkpoint of the diverged state was written: %v", entries)
	}
	// The good checkpoint still resumes.
	if err := run(context.Background(), small(t.TempDir(), "--steps", "6", "--resume", filepath.Join(out, "step-000002"))); err != nil {
		t.Fatalf("the good checkpoint no longer resumes: %v", err)
	}
}

// poisonWeights overwrites every float32 of a checkpoint's model.safetensors
// with NaN and updates its sha256 in state.json.
func poisonWeights(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	start := 8 + int(binary.LittleEndian.Uint64(data[:8]))
	for i := start; i+4 <= len(data); i += 4 {
		binary.LittleEndian.PutUint32(data[i:], 0x7fc00000)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	statePath := filepath.Join(dir, "state.json")
	st, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	var state map[string]any
	if err := json.Unmarshal(st, &state); err != nil {
		t.Fatal(err)
	}
	files, ok := state["files"].(map[string]any)
	if !ok {
		t.Fatalf("state.json has no files map: %s", st)
	}
	sum := sha256.Sum256(data)
	files["model.safetensors"] = hex.EncodeToString(sum[:])
	st, _ = json.Marshal(state)
	if err := os.WriteFile(statePath, st, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceCudaWithoutGPUFailsClearly(t *testing.T) {
	if b, _, _, err := openBackend("cuda", GroupedAuto); err == nil {
		if c, ok := b.(interface{ Close() error }); ok {
			c.Close()
		}
		t.Skip("a GPU is present: this test covers machines without one")
	}
	out, code := runMain(t, small(t.TempDir(), "--device", "cuda")...)
	if code == 0 || !strings.Contains(out, "--device cuda") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	// auto falls back to the CPU with one calm line; --verbose adds why.
	out, code = runMain(t, small(t.TempDir(), "--device", "auto", "--steps", "1", "--warmup", "0")...)
	if code != 0 || !strings.Contains(out, "device: no GPU found: training on the CPU") || strings.Contains(out, "cannot load") {
		t.Fatalf("--device auto without a GPU: exit %d, want one line \"no GPU found: training on the CPU\" and no loader error; output:\n%s", code, out)
	}
	out, code = runMain(t, small(t.TempDir(), "--device", "auto", "--steps", "1", "--warmup", "0", "--verbose")...)
	if code != 0 || !strings.Contains(out, "device: no GPU because: ") {
		t.Fatalf("--device auto --verbose without a GPU: exit %d, want the reason; output:\n%s", code, out)
	}
	// --memory-report reports the CUDA allocator: on the CPU it is refused.
	out, code = runMain(t, small(t.TempDir(), "--device", "auto", "--memory-report")...)
	if code != 1 || !strings.Contains(out, "--memory-report: expected the CUDA backend") {
		t.Fatalf("--memory-report without a GPU: exit %d, want 1 and the refusal; output:\n%s", code, out)
	}
}

// -help lists the flags and exits 0, as asking for help is no failure.
func TestHelpExitsZero(t *testing.T) {
	out, code := runMain(t, "-help")
	if code != 0 || !strings.Contains(out, "-steps") || !strings.Contains(out, "-verbose") {
		t.Fatalf("-help: exit %d, want 0 and the flags listed:\n%s", code, out)
	}
}
