package main

// Ranks as processes on the CPU (--comm tcp): --nproc's launcher, the ranks
// of another launcher (torchrun's variables), a rank that dies, and the
// GPU transports' errors on a machine without their libraries. The
// launcher runs in the test process; the ranks it starts are the test
// binary, which TestMain makes run the command.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm/nccl"
	"github.com/asynctp/asynctp/comm/nvshmem"
	"github.com/asynctp/asynctp/train"
)

// --nproc 2 over tcp at TP 2, DP 2 and EP 2 (tiny-moe) writes the losses
// of the single-process run step by step.
func TestProcessesMatchSingle(t *testing.T) {
	single := map[string][]train.StepMetrics{}
	for _, model := range []string{"tiny", "tiny-moe"} {
		single[model] = metrics(t, trainRun(t, "--model", model))
	}
	for _, c := range []struct {
		model string
		args  []string
	}{
		{"tiny", []string{"--tp", "2"}},
		{"tiny", []string{"--dp", "2"}},
		{"tiny-moe", []string{"--ep", "2"}},
	} {
		args := append([]string{"--nproc", "2", "--comm", "tcp", "--model", c.model}, c.args...)
		start := time.Now()
		out := trainRun(t, args...)
		name := strings.Join(args, " ")
		sameRun(t, name, metrics(t, out), single[c.model], 1e-4)
		checkParallelOutputs(t, out, 2, func() ParallelConfig {
			cfg, err := loadConfig(par(out, args...))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Parallel.Comm = CommTCP
			return cfg.Parallel
		}())
		t.Logf("%s: %v", name, time.Since(start).Round(time.Millisecond))
	}
}

// The ranks of another launcher: two processes started with torchrun's
// variables (no --nproc) train together, rank 0 hosting the store.
func TestLauncherEnvironment(t *testing.T) {
	single := metrics(t, trainRun(t))
	out := t.TempDir()
	port := freePort(t)
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	for r := range 2 {
		cmd := exec.Command(os.Args[0], par(out, "--tp", "2")...)
		cmd.Env = append(os.Environ(), "ASYNCTP_TRAIN_MAIN=1", "RANK="+strconv.Itoa(r), "WORLD_SIZE=2",
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port,
			"TORCHELASTIC_RUN_ID=test-"+port)
		wg.Go(func() {
			b, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(b), err
		})
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v; its output:\n%s", r, errs[r], outs[r])
		}
	}
	if !strings.Contains(outs[0], "2 processes (torchrun)") || strings.Contains(outs[1], "step") {
		t.Errorf("rank 0 should say who launched it, rank 1 print nothing; rank 0:\n%s\nrank 1:\n%s", outs[0], outs[1])
	}
	sameRun(t, "torchrun-style --tp 2", metrics(t, out), single, 1e-4)
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// A rank that dies mid-run (killed with SIGKILL, or exiting with an
// error, after step 8, before its checkpoint of step 8, or killed in the
// middle of its asynchronous save of step 8) makes the launcher
// and the other rank exit non-zero at once with errors naming it; the run
// then resumes from the last checkpoint every rank holds (step 4; rank 0
// also wrote step 8) and ends with the losses of an uninterrupted run.
func TestProcessDies(t *testing.T) {
	single := metrics(t, trainRun(t))
	for _, c := range []struct {
		mode, want string
	}{
		{"8:1", "rank 1 was killed by signal killed"},
		{"8:1:exit", "rank 1 exited with status 3"},
		{"8:1:save", "rank 1 was killed by signal killed"}, // in its asynchronous save of step 8
	} {
		t.Run(c.mode, func(t *testing.T) {
			out := t.TempDir()
			args := par(out, "--nproc", "2", "--tp", "2", "--checkpoint-every", "4", "--comm-timeout", "20s")
			t.Setenv(envFault, c.mode)
			start := time.Now()
			err := run(context.Background(), args)
			took := time.Since(start)
			os.Unsetenv(envFault)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			for _, want := range []string{c.want, "rank 0: exited with status 1 on its own", "world rank 1 is gone"} {
				if !strings.Contains(msg, want) {
					t.Errorf("the launcher's error does not say %q:\n%s", want, msg)
				}
			}
			if took > 10*time.Second {
				t.Errorf("the run took %v to fail, want well within the deadline of 20s", took)
			}
			t.Logf("failed after %v:\n%v", took.Round(time.Millisecond), err)
			for r, want := range []string{"step-000008", "step-000004"} {
				ck, err := train.ResolveCheckpoint(filepath.Join(out, fmt.Sprintf("rank-%05d", r)))
				if err != nil || filepath.Base(ck) != want {
					t.Fatalf("rank %d's latest checkpoint %s, %v; want %s", r, ck, err, want)
				}
			}
			if strings.HasSuffix(c.mode, ":save") {
				// Killed in the middle of writing step 8: its files were
				// written under a temporary name, never renamed into place.
				tmp, _ := filepath.Glob(filepath.Join(train.RankDir(out, 1), ".tmp-step-000008-*"))
				if _, err := os.Stat(filepath.Join(train.RankDir(out, 1), "step-000008")); err == nil || len(tmp) != 1 {
					t.Fatalf("rank 1 after the kill in its save: step-000008 there (%v), temporary dirs %v; want none and one", err == nil, tmp)
				}
			}
			if err := run(context.Background(), append(args, "--resume", out)); err != nil {
				t.Fatalf("resume: %v", err)
			}
			sameRun(t, "killed and resumed", metrics(t, out), single, 1e-4)
			if tmp, _ := filepath.Glob(filepath.Join(train.RankDir(out, 1), ".tmp-*")); len(tmp) != 0 {
				t.Errorf("temporary dirs left after the resume: %v", tmp)
			}
		})
	}
}

// The test hook's variable is checked.
func TestFaultHookSyntax(t *testing.T) {
	for _, v := range []string{"x", "8", "8:x", "8:1:kill", "1:2:3:4"} {
		t.Setenv(envFault, v)
		if _, err := faultHooks(0, Config{}); err == nil || !strings.Contains(err.Error(), envFault) {
			t.Errorf("%s=%q: error %v", envFault, v, err)
		}
	}
	t.Setenv(envFault, "8:1")
	if f, err := faultHooks(0, Config{}); err != nil || f.step != nil || f.save != nil {
		t.Errorf("another rank's fault: %v, %v", f.step != nil || f.save != nil, err)
	}
}

// --comm nccl and nvshmem on a machine without their libraries fail at
// start with the transport's error, naming the library and the variable
// that overrides its path, and start no process.
func TestGPUCommWithoutLibrary(t *testing.T) {
	for _, c := range []struct {
		comm, want, env string
		missing         func() bool
	}{
		{"nccl", "libnccl.so.2", nccl.EnvLibNCCL, func() bool { _, err := nccl.Load(); return err != nil }},
		{"nvshmem", "libasynctp_nvshmem.so", nvshmem.EnvLibrary, func() bool { _, err := nvshmem.Load(); return err != nil }},
	} {
		if !c.missing() {
			t.Logf("%s loads on this machine: skipping its case", c.comm)
			continue
		}
		for _, args := range [][]string{{"--comm", c.comm}, {"--comm", c.comm, "--nproc", "2", "--tp", "2"}} {
			out := filepath.Join(t.TempDir(), "out")
			msg, code := runMain(t, small(out, args...)...)
			if code == 0 || !strings.Contains(msg, c.want) || !strings.Contains(msg, c.env) {
				t.Errorf("%v: exit %d, want non-zero naming %s and %s; output:\n%s", args, code, c.want, c.env, msg)
			}
			if strings.Contains(msg, "launcher:") {
				t.Errorf("%v: processes were started before the library error:\n%s", args, msg)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%v: the out dir was created", args)
			}
		}
	}
}

// --comm and --nproc against the layout, the device and the launcher,
// before any work.
func TestCommConfig(t *testing.T) {
	for _, c := range []struct {
		args []string
		o    origin
		want string // error, or "" for none
		comm string
		dp   int
	}{
		{args: nil, comm: CommLocal, dp: 1},
		{args: []string{"--tp", "2"}, comm: CommLocal, dp: 1},
		{args: []string{"--nproc", "2"}, comm: CommTCP, dp: 2},
		{args: []string{"--nproc", "4", "--tp", "2"}, comm: CommTCP, dp: 2},
		{args: []string{"--nproc", "2", "--device", "cuda", "--tp", "2"}, comm: CommNCCL, dp: 1},
		{args: []string{"--nproc", "2", "--comm", "nvshmem", "--tp", "2"}, comm: CommNVSHMEM, dp: 1},
		{args: []string{"--tp", "2"}, o: origin{launched: true, world: 4}, comm: CommTCP, dp: 2},
		{args: nil, o: origin{launched: true, world: 1}, comm: CommTCP, dp: 1},
		{args: []string{"--comm", "nccl"}, comm: CommNCCL, dp: 1},
		{args: []string{"--nproc", "2", "--comm", "local"}, want: "--comm local runs the ranks as goroutines"},
		{args: []string{"--comm", "tcp", "--tp", "2"}, want: "add --nproc 2"},
		{args: []string{"--nproc", "2", "--comm", "tcp", "--device", "cuda"}, want: "--comm tcp moves host tensors"},
		{args: []string{"--nproc", "2", "--comm", "nccl", "--device", "cpu"}, want: "--comm nccl moves GPU tensors"},
		{args: []string{"--nproc", "3", "--tp", "2", "--dp", "2"}, want: "--nproc 3 starts 3 processes, but the layout"},
		{args: []string{"--tp", "2", "--dp", "2"}, o: origin{launched: true, world: 2}, want: "the launcher started 2 processes, but the layout"},
		{args: []string{"--comm", "gloo"}, want: `unknown --comm "gloo"`},
		{args: []string{"--tp", "2", "--device", "cuda"}, want: "--device cuda takes one rank, or processes on GPUs"},
	} {
		cfg, err := loadConfigIn(small(t.TempDir(), c.args...), c.o)
		switch {
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v %+v: error %v, want one containing %q", c.args, c.o, err, c.want)
		case c.want == "" && err != nil:
			t.Errorf("%v %+v: %v", c.args, c.o, err)
		case c.want == "" && (cfg.Parallel.Comm != c.comm || cfg.Parallel.DP != c.dp):
			t.Errorf("%v %+v: comm %q, dp %d; want %q, %d", c.args, c.o, cfg.Parallel.Comm, cfg.Parallel.DP, c.comm, c.dp)
		}
	}
}
