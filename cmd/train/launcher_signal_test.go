package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynctp/asynctp/train"
)

// --nproc's launcher passes both signals on: the first stops the ranks
// after their step, a second stops them at once; the launcher exits 130
// (SIGINT's conventional status) saying so, and every rank's last
// complete checkpoint stays readable.
func TestLauncherPassesSecondSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two rank processes with steps of seconds")
	}
	d := t.TempDir()
	cmd := exec.Command(os.Args[0], "--layers", "1", "--dim", "32", "--heads", "2", "--seq", "4096", "--batch", "2",
		"--steps", "50", "--warmup", "0", "--log-every", "1", "--checkpoint-every", "1", "--val-fraction", "0",
		"--nproc", "2", "--comm", "tcp", "--tp", "2", "--device", "cpu", "--out", d)
	cmd.Env = append(os.Environ(), "ASYNCTP_TRAIN_MAIN=1")
	out := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(out.String(), "checkpoint "+filepath.Join(d, "rank-00000", "step-000001")) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no checkpoint of step 1 within 90 s:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	awaitFirstSignal(t, cmd, out)
	sent := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	took := time.Since(sent)
	t.Logf("launcher exited %v after the second SIGINT: %v", took.Round(time.Millisecond), err)
	if err == nil || took > 10*time.Second {
		t.Fatalf("the launcher after a second SIGINT: %v after %v, want a non-zero exit within seconds:\n%s", err, took, out.String())
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Errorf("the launcher stopped by SIGINT: %v, want exit status 130 (128 + 2)", err)
	}
	if !strings.Contains(out.String(), "passed on the second interrupt") {
		t.Errorf("the launcher's summary does not say it passed the second interrupt on:\n%s", out.String())
	}
	for r := range 2 {
		rd := filepath.Join(d, fmt.Sprintf("rank-%05d", r))
		ck, err := train.ResolveCheckpoint(rd)
		if err != nil {
			t.Fatalf("rank %d: no readable checkpoint after the second signal: %v", r, err)
		}
		if _, err := os.Stat(filepath.Join(ck, "state.json")); err != nil {
			t.Errorf("rank %d: checkpoint %s incomplete: %v", r, ck, err)
		}
	}
}
