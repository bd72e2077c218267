package main

// The rules a run follows (docs/usage.md), through the real command (a
// child process per run): out dirs, locks, resumes that change the model,
// explicit values, signals, evaluation.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynctp/asynctp/train"
)

// runIn runs the command in dir (its working directory).
func runIn(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Dir = dir
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

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, code := runMain(t, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d:\n%s", args, code, out)
	}
	return out
}

func steps(t *testing.T, dir string) []int {
	t.Helper()
	recs, err := train.ReadMetrics(filepath.Join(dir, train.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	var s []int
	for _, r := range recs {
		s = append(s, r.Step)
	}
	return s
}

func seq(lo, hi int) []int {
	var s []int
	for i := lo; i <= hi; i++ {
		s = append(s, i)
	}
	return s
}

// 1. --resume DIR without --out writes to DIR; a checkpoint dir names its
// run's out dir.
func TestResumeWritesToItsRun(t *testing.T) {
	cwd := t.TempDir()
	run := filepath.Join(t.TempDir(), "p")
	mustRun(t, small(run, "--steps", "4")...)
	noOut := func(steps string) []string {
		a := small(run, "--steps", steps)
		for i := range a {
			if a[i] == "--out" {
				return append(a[:i:i], a[i+2:]...)
			}
		}
		return a
	}
	if out, code := runIn(t, cwd, append(noOut("6"), "--resume", run)...); code != 0 {
		t.Fatalf("resume: exit %d:\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(cwd, "train-out")); err == nil {
		t.Fatal("the resume wrote ./train-out")
	}
	if got := fmt.Sprint(steps(t, run)); got != fmt.Sprint(seq(1, 6)) {
		t.Fatalf("metrics steps %s, want 1..6 in the resumed run's dir", got)
	}
	if out, code := runIn(t, cwd, append(noOut("8"), "--resume", filepath.Join(run, "step-000006"))...); code != 0 {
		t.Fatalf("resume from a checkpoint dir: exit %d:\n%s", code, out)
	}
	if got := fmt.Sprint(steps(t, run)); got != fmt.Sprint(seq(1, 8)) {
		t.Fatalf("metrics steps %s, want 1..8", got)
	}
}

// 2. A new run into a run's dir is refused unless --overwrite; a live lock
// refuses a second run, a stale one is taken over.
func TestOutDirHoldsRunAndLock(t *testing.T) {
	a := t.TempDir()
	mustRun(t, small(a, "--steps", "6")...)
	out, code := runMain(t, small(a, "--steps", "2")...)
	if code == 0 || !strings.Contains(out, "already holds a run") || !strings.Contains(out, "--overwrite") {
		t.Fatalf("a new run into a run's dir: exit %d:\n%s", code, out)
	}
	if got := len(steps(t, a)); got != 6 {
		t.Fatalf("the refused run changed metrics.jsonl: %d records, want 6", got)
	}
	os.WriteFile(filepath.Join(a, "notes.txt"), []byte("mine"), 0o644)
	mustRun(t, small(a, "--steps", "2", "--overwrite")...)
	if got := fmt.Sprint(steps(t, a)); got != "[1 2]" {
		t.Fatalf("after --overwrite: steps %s, want [1 2]", got)
	}
	if _, err := os.Stat(filepath.Join(a, "step-000006")); err == nil {
		t.Fatal("--overwrite kept the old run's step-000006")
	}
	if _, err := os.Stat(filepath.Join(a, "notes.txt")); err != nil {
		t.Fatal("--overwrite removed a file that is not the run's")
	}

	// A lock held by a live process of this host (this test).
	b := t.TempDir()
	host, _ := os.Hostname()
	lock := filepath.Join(b, LockFile)
	os.WriteFile(lock, fmt.Appendf(nil, `{"pid": %d, "host": %q, "started": "then"}`, os.Getpid(), host), 0o644)
	out, code = runMain(t, small(b, "--steps", "2")...)
	if code == 0 || !strings.Contains(out, fmt.Sprintf("in use by the run of pid %d on host %s", os.Getpid(), host)) {
		t.Fatalf("a live lock: exit %d:\n%s", code, out)
	}
	// A lock of a process that has ended.
	dead := exec.Command("true")
	dead.Run()
	os.WriteFile(lock, fmt.Appendf(nil, `{"pid": %d, "host": %q, "started": "then"}`, dead.Process.Pid, host), 0o644)
	out = mustRun(t, small(b, "--steps", "2")...)
	if !strings.Contains(out, "stale lock") {
		t.Errorf("a stale lock taken over without a word:\n%s", out)
	}
	if _, err := os.Stat(lock); err == nil {
		t.Error("the lock is still there after the run")
	}
}

// Two runs started together on one dir: one runs, the other is refused.
func TestTwoRunsOneDir(t *testing.T) {
	d := t.TempDir()
	args := small(d, "--steps", "30")
	c1 := exec.Command(os.Args[0], args...)
	c1.Env = append(os.Environ(), "ASYNCTP_TRAIN_MAIN=1")
	var o1 strings.Builder
	c1.Stdout, c1.Stderr = &o1, &o1
	if err := c1.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ { // until the first holds the lock
		if _, err := os.Stat(filepath.Join(d, LockFile)); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	out2, code2 := runMain(t, args...)
	err1 := c1.Wait()
	if err1 != nil || code2 == 0 || !strings.Contains(out2, "in use by the run of pid") {
		t.Fatalf("first: %v\n%s\nsecond: exit %d\n%s", err1, o1.String(), code2, out2)
	}
	if got := fmt.Sprint(steps(t, d)); got != fmt.Sprint(seq(1, 30)) {
		t.Fatalf("steps %s, want the first run's 1..30 alone", got)
	}
}

// 3. A resume that changes the model is refused naming each field; one
// that leaves the model out takes the checkpoint's.
func TestResumeModelMustMatch(t *testing.T) {
	d := t.TempDir()
	mustRun(t, small(d, "--steps", "4", "--heads", "2", "--dim", "32")...)
	cfgBefore, _ := os.ReadFile(filepath.Join(d, "config.json"))
	out, code := runMain(t, small(d, "--steps", "6", "--heads", "4", "--layers", "2", "--resume", d)...)
	if code == 0 || !strings.Contains(out, "heads: given 4, the checkpoint's 2") || !strings.Contains(out, "layers: given 2, the checkpoint's 1") {
		t.Fatalf("resume with other heads and layers: exit %d:\n%s", code, out)
	}
	if after, _ := os.ReadFile(filepath.Join(d, "config.json")); string(after) != string(cfgBefore) {
		t.Error("the refused resume rewrote config.json")
	}
	// Only the run's knobs: the model comes from the checkpoint.
	mustRun(t, "--steps", "6", "--batch", "4", "--warmup", "2", "--log-every", "100", "--resume", d)
	var cfg Config
	js, _ := os.ReadFile(filepath.Join(d, "config.json"))
	if err := json.Unmarshal(js, &cfg); err != nil || cfg.Model.Dim != 32 || cfg.Model.Layers != 1 || cfg.Model.Seq != 16 {
		t.Fatalf("config.json after a resume without model flags: %+v, %v", cfg.Model, err)
	}
	// A failed resume (a corrupted checkpoint) leaves config.json as it was.
	ck := filepath.Join(d, "step-000006", train.ModelFile)
	b, _ := os.ReadFile(ck)
	b[len(b)-1] ^= 1
	os.WriteFile(ck, b, 0o644)
	before, _ := os.ReadFile(filepath.Join(d, "config.json"))
	if out, code := runMain(t, "--steps", "8", "--batch", "2", "--warmup", "2", "--resume", d); code == 0 || !strings.Contains(out, "corrupted") {
		t.Fatalf("resume from a corrupted checkpoint: exit %d:\n%s", code, out)
	}
	if after, _ := os.ReadFile(filepath.Join(d, "config.json")); string(after) != string(before) {
		t.Error("the failed resume rewrote config.json")
	}
}

// 5. Explicit values are used or refused, never replaced; config.json
// holds the resolved values. 6. One "train:" prefix; the coefficients of
// --experts on tiny.
func TestExplicitValues(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--steps", "0"}, "steps = 0"},
		{[]string{"--lr", "0"}, "lr = 0"},
		{[]string{"--batch", "0"}, "batch = 0"},
		{[]string{"--log-every", "0"}, "log_every = 0"},
		{[]string{"--steps", "3", "--warmup", "500"}, "warmup = 500"},
		{[]string{"--eval-every", "0"}, "eval_every"},
	} {
		out, code := runMain(t, append([]string{"--out", t.TempDir()}, c.args...)...)
		if code == 0 || !strings.Contains(out, c.want) || strings.Contains(out, "train: train:") {
			t.Errorf("%v: exit %d, want a refusal naming %q with one prefix:\n%s", c.args, code, c.want, out)
		}
	}
	cfg, err := loadConfig([]string{"--beta1", "0", "--steps", "3"})
	if err != nil || cfg.Train.Beta1 != 0 || cfg.Train.Warmup != 3 {
		t.Fatalf("--beta1 0 --steps 3: beta1 %v warmup %d (the preset's 20 shrinks to the steps) %v", cfg.Train.Beta1, cfg.Train.Warmup, err)
	}
	d := t.TempDir()
	mustRun(t, small(d, "--steps", "2", "--beta1", "0", "--experts", "4")...)
	var got Config
	js, _ := os.ReadFile(filepath.Join(d, "config.json"))
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatal(err)
	}
	m := got.Model
	if got.Train.Beta1 != 0 || m.FFN != 128 || m.RopeTheta != 10000 || m.NormEps != 1e-5 || m.TopK != 2 || m.MoEEvery != 1 || m.AuxLossCoef != 0.01 || m.ZLossCoef != 1e-3 {
		t.Fatalf("config.json: beta1 %v, model %+v; want beta1 0 and the resolved ffn 128, rope 10000, eps 1e-5, top-k 2, moe-every 1, aux 0.01, z 1e-3", got.Train.Beta1, m)
	}
}

// 4. A signal in the middle of a long step stops the run within about a
// second with the previous step's checkpoint, exiting 143 for SIGTERM; a
// second signal stops at once, exiting 130 for SIGINT.
func TestSignalStopsLongStep(t *testing.T) {
	d := t.TempDir()
	args := []string{"--layers", "1", "--dim", "32", "--heads", "2", "--seq", "8192", "--batch", "1", "--steps", "4",
		"--warmup", "0", "--log-every", "1", "--checkpoint-every", "1", "--val-fraction", "0", "--out", d}
	start := func() (*exec.Cmd, *syncBuffer) {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "ASYNCTP_TRAIN_MAIN=1")
		out := new(syncBuffer)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, out
	}
	cmd, out := start()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "checkpoint "+filepath.Join(d, "step-000001")) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no checkpoint of step 1 within 60 s:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // inside step 2
	sent := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	late := time.Since(sent)
	t.Logf("stopped %v after SIGTERM", late.Round(time.Millisecond))
	if err == nil || late > 3*time.Second || !strings.Contains(out.String(), "stopped in step 2") {
		t.Fatalf("SIGTERM in step 2: %v after %v:\n%s", err, late, out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 143 {
		t.Fatalf("a run stopped by SIGTERM: %v, want exit status 143 (128 + 15)", err)
	}
	if ck, _ := train.LatestCheckpoint(d); filepath.Base(ck) != "step-000001" {
		t.Fatalf("latest checkpoint %s, want step-000001", ck)
	}
	// A parallel run stops at the end of the step: a second signal stops
	// it at once, leaving its last complete checkpoint.
	d = t.TempDir()
	args[len(args)-1] = d
	args = append(args, "--tp", "2")
	cmd, out = start()
	ck1 := filepath.Join(d, "rank-00000", "step-000001")
	for !strings.Contains(out.String(), "checkpoint "+ck1) {
		if time.Now().After(deadline.Add(60 * time.Second)) {
			cmd.Process.Kill()
			t.Fatalf("no checkpoint of step 1:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGINT)
	// The second signal goes once the first has been handled: two sent
	// before the process runs its handler are one pending signal.
	awaitFirstSignal(t, cmd, out)
	sent = time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 || time.Since(sent) > 2*time.Second {
		t.Fatalf("a second SIGINT: %v after %v, want exit 130 at once:\n%s", err, time.Since(sent), out)
	}
	for r := range 2 {
		if ck, _ := train.LatestCheckpoint(filepath.Join(d, fmt.Sprintf("rank-%05d", r))); filepath.Base(ck) != "step-000001" {
			t.Fatalf("rank %d: latest checkpoint %s after the second signal, want step-000001", r, ck)
		}
	}
}

// awaitFirstSignal waits until the process whose output is out says it
// handled its first signal (it stops after the step; a second signal
// now is a second one), or fails the test after 30 s.
func awaitFirstSignal(t *testing.T, cmd *exec.Cmd, out *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "a second signal stops at once") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("the first signal not handled within 30 s:\n%s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Evaluation: the default run's metrics hold val_loss and val_ppl at the
// eval steps and the last; the log and the summary print both losses.
func TestValidationCurve(t *testing.T) {
	d := t.TempDir()
	out := mustRun(t, small(d, "--steps", "6", "--eval-every", "3", "--eval-batches", "2", "--log-every", "3")...)
	recs, err := train.ReadMetrics(filepath.Join(d, train.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		v, has := r.Extra["val_loss"].(float64)
		if has != (r.Step%3 == 0) {
			t.Errorf("step %d: val_loss present %v", r.Step, has)
		}
		if has && (!(v > 0) || math.Abs(r.Extra["val_ppl"].(float64)-math.Exp(v)) > 1e-9*math.Exp(v)) {
			t.Errorf("step %d: val_loss %v, val_ppl %v", r.Step, v, r.Extra["val_ppl"])
		}
	}
	if !strings.Contains(out, "| val_loss ") || !strings.Contains(out, "validation loss") {
		t.Errorf("output without the validation loss:\n%s", out)
	}
	if out, code := runMain(t, small(t.TempDir(), "--val-fraction", "0.00001")...); code == 0 || !strings.Contains(out, "held-out split") {
		t.Errorf("a held-out split too small for one window: exit %d\n%s", code, out)
	}
}

// The held-out split's errors name their cause: a tail too short for one
// window says how large a fraction would hold one; an id beyond the
// vocabulary in the tail is named as such, with no advice about the
// fraction (a larger one would not help).
func TestValidationSplitErrors(t *testing.T) {
	text := filepath.Join(t.TempDir(), "short.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("a short text. ", 72)), 0o644); err != nil { // 1008 tokens
		t.Fatal(err)
	}
	out, code := runMain(t, small(t.TempDir(), "--data", text, "--val-fraction", "0.01")...) // 10 tokens held out
	if code != 1 || !strings.Contains(out, "fewer than one window of seq+1 = 17") || !strings.Contains(out, "give --val-fraction 0.02 or more") {
		t.Errorf("a held-out tail of 10 tokens: exit %d, want the window size and the fraction that holds one:\n%s", code, out)
	}
	if _, code := runMain(t, small(t.TempDir(), "--data", text, "--val-fraction", "0.02", "--steps", "1", "--warmup", "0")...); code != 0 {
		t.Errorf("--val-fraction 0.02, as the hint says: exit %d", code)
	}
	tiny := filepath.Join(t.TempDir(), "tiny.txt")
	if err := os.WriteFile(tiny, []byte("twenty bytes of text"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := runMain(t, small(t.TempDir(), "--data", tiny)...); code != 1 || !strings.Contains(out, "give --val-fraction 0") {
		t.Errorf("data too short to hold a window out: exit %d:\n%s", code, out)
	}
	// uint16 ids below 256 but for the last 20, which are 300: only the
	// held-out tail has ids beyond the tiny model's vocabulary.
	b := make([]byte, 2*2000)
	for i := range 2000 {
		v := uint16(i % 200)
		if i >= 1980 {
			v = 300
		}
		b[2*i], b[2*i+1] = byte(v), byte(v>>8)
	}
	bin := filepath.Join(t.TempDir(), "tokens.bin")
	if err := os.WriteFile(bin, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = runMain(t, small(t.TempDir(), "--data", bin, "--val-fraction", "0.1")...)
	if code != 1 || !strings.Contains(out, "token id 300") || strings.Contains(out, "larger --val-fraction") || strings.Contains(out, "give --val-fraction") {
		t.Errorf("an id beyond the vocabulary in the held-out tail: exit %d, want the id named and no advice about the fraction:\n%s", code, out)
	}
}
