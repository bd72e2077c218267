package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/launch"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
	"github.com/asynctp/asynctp/train"
)

// envFault is a test hook (see faultHook).
const envFault = "ASYNCTP_FAULT_EXIT_AT_STEP"

// startedBy reads how this process was started: a rank of a launcher's
// world (ASYNCTP_* of --nproc's launcher, whatever its size; torchrun, srun
// or mpirun with a world of more than one process), or on its own.
func startedBy() (rendezvous.Info, origin, error) {
	info, launched, err := launch.StartedBy(nil)
	if err != nil || !launched {
		return info, origin{}, err
	}
	return info, origin{launched: true, world: info.WorldSize}, nil
}

// worldOptions are the options of the world of a rank of cfg: its
// transport, deadline and layout, and its backend's (newRankBackend and
// --grouped-gemm on the CPU; the environment's and --grouped-gemm on GPUs).
func worldOptions(cfg Config) (launch.Options, error) {
	p := cfg.Parallel
	o := launch.Options{Transport: p.Comm, Timeout: time.Duration(p.CommTimeout), DP: p.DP, TP: p.TP, EP: p.EP,
		CPU: func(rank, threads int) (tensor.Backend, error) {
			return cpuGrouped(newRankBackend(rank, threads), cfg.GroupedGEMM)
		},
		Exit: os.Exit}
	if launch.GPU(p.Comm) {
		opts, _, _, err := cudaOptions(cfg.GroupedGEMM)
		if err != nil {
			return o, err
		}
		if cfg.memReport {
			opts = append(opts, cudabackend.WithMemLedger())
		}
		o.CUDA = opts
	}
	return o, nil
}

// runRankProcess is this process's rank of a world of processes: started by
// --nproc's launcher, torchrun, srun or mpirun, or alone (a world of one).
// It opens its world (launch.Open: the store, the transport, the backend,
// the grid) and trains its part of the model (train.RunSharded) like a
// goroutine rank of runParallel: rank 0 prints and writes metrics.jsonl and
// config.json, every rank writes its own checkpoints under OUT/rank-NNNNN.
// An error aborts the world, so that the other ranks stop at once with an
// error naming this rank.
func runRankProcess(ctx context.Context, cfg Config, info rendezvous.Info) error {
	err := rankProcess(ctx, cfg, info)
	if err != nil && info.WorldSize > 1 {
		return fmt.Errorf("rank %d: %w", info.Rank, err)
	}
	return err
}

func rankProcess(ctx context.Context, cfg Config, info rendezvous.Info) error {
	p := cfg.Parallel
	rank := info.Rank
	say := func(format string, args ...any) {
		if rank == 0 {
			fmt.Printf(format, args...)
		}
	}
	fault, err := faultHooks(rank, cfg)
	if err != nil {
		return err
	}
	ds, err := openDataset(cfg)
	if err != nil {
		return err
	}
	probe, err := train.NewLoader(ds, loaderConfig(cfg)) // the data's errors before joining
	if err != nil {
		return err
	}
	o, err := worldOptions(cfg)
	if err != nil {
		return err
	}
	w, err := launch.Open(ctx, info, o)
	if err != nil {
		return err
	}
	say("device: %s\n", w.Device)
	why := ""
	if cfg.commWhy != "" {
		why = " (" + cfg.commWhy + ")"
	}
	say("parallel: %s over --comm %s%s, %d processes (%s), comm timeout %v\n", p, p.Comm, why, info.WorldSize, launch.LauncherName(info, nil), time.Duration(p.CommTimeout))
	say("hosts: %s\n", w.HostSummary())
	mc := cfg.Model.WithDefaults()
	say("%s\n", modelLine(cfg.Preset, mc, paramCount(mc)))
	say("data: %s, %d tokens; batch %d x %d, %d steps\n", probe.Name(), probe.Tokens(), cfg.Train.Batch, cfg.Train.Seq, cfg.Train.Steps)
	if rank == 0 {
		printResume(cfg)
	}
	res, err := trainRank(ctx, w, cfg, ds, fault)
	if err == nil {
		// Nobody closes its connections while another still trains.
		if err = w.Comm.Barrier(); err != nil {
			err = fmt.Errorf("the final barrier: %w", err)
		}
	}
	if err != nil {
		w.Fail(err)
		return err
	}
	say("done: step %d, loss %.4f, %.0f tokens/s; checkpoints %s\n", res.Step, res.FinalLoss, res.TokensPerSec,
		filepath.Join(cfg.Train.OutDir, "rank-*", filepath.Base(res.LastCheckpoint)))
	if l, ok := w.Backend.(interface {
		MemLedger() (cudabackend.MemReport, bool)
	}); ok && rank == 0 {
		if r, on := l.MemLedger(); on {
			fmt.Printf("memory of rank 0 of %d:\n", info.WorldSize)
			r.Write(os.Stdout, true)
		}
	}
	w.Close()
	return nil
}

// faults are the test hooks of a rank (faultHooks): after a step, and in
// the background writer of a checkpoint.
type faults struct {
	step func(train.StepMetrics)
	save func(step int)
}

// faultHooks is the test hook ASYNCTP_FAULT_EXIT_AT_STEP=<step>:<rank>[:exit|:save]:
// that rank dies right after that step (once the checkpoints of the steps
// before it are complete), before the step's checkpoint, as a crashed
// process would: killed by SIGKILL, or with ":exit" exiting with
// status 3; with ":save" it is killed in the middle of its asynchronous save
// of that step's checkpoint (its files written, not yet renamed into
// place). The failure tests of the launcher use it; never set it in a real
// run.
func faultHooks(rank int, cfg Config) (faults, error) {
	v := os.Getenv(envFault)
	if v == "" {
		return faults{}, nil
	}
	parts := strings.Split(v, ":")
	step, err1 := strconv.Atoi(parts[0])
	var r int
	var err2 error
	if len(parts) > 1 {
		r, err2 = strconv.Atoi(parts[1])
	}
	if len(parts) < 2 || len(parts) > 3 || err1 != nil || err2 != nil || len(parts) == 3 && parts[2] != "exit" && parts[2] != "save" {
		return faults{}, fmt.Errorf("%s=%q: expected <step>:<rank>, <step>:<rank>:exit or <step>:<rank>:save (a test hook)", envFault, v)
	}
	if r != rank {
		return faults{}, nil
	}
	kill := func(when string) {
		fmt.Fprintf(os.Stderr, "train: rank %d: %s: killing this process %s (a test hook)\n", rank, envFault, when)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			p.Kill() // SIGKILL: no deferred function runs, nothing is closed
		}
		select {}
	}
	if len(parts) == 3 && parts[2] == "save" {
		return faults{save: func(s int) {
			if s == step {
				kill(fmt.Sprintf("in the middle of its save of step %d", step))
			}
		}}, nil
	}
	// The checkpoints before the step are written in the background: the
	// rank dies once they are complete, so that what it leaves is known.
	settle := func() {
		every := cfg.Train.CheckpointEvery
		if every <= 0 || step <= every {
			return
		}
		want := train.CheckpointName((step - 1) / every * every)
		dir := train.RankDir(cfg.Train.OutDir, rank)
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if ck, err := train.LatestCheckpoint(dir); err == nil && filepath.Base(ck) >= want {
				return
			}
		}
	}
	return faults{step: func(m train.StepMetrics) {
		if m.Step != step {
			return
		}
		settle()
		if len(parts) == 3 {
			fmt.Fprintf(os.Stderr, "train: rank %d: %s: exiting with status 3 after step %d (a test hook)\n", rank, envFault, step)
			os.Exit(3)
		}
		kill(fmt.Sprintf("after step %d", step))
	}}, nil
}

// launchLocal is --nproc N: launch.Spawn starts N processes of this command
// with the same arguments, one rank each, and passes on the interrupts.
func launchLocal(ctx context.Context, cfg Config, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--nproc: finding this executable: %w", err)
	}
	forwardSecond.Store(true)
	defer forwardSecond.Store(false)
	return launch.Spawn(ctx, launch.SpawnConfig{N: cfg.Parallel.NProc, Command: append([]string{exe}, args...),
		Transport: cfg.Parallel.Comm, Timeout: time.Duration(cfg.Parallel.CommTimeout), Second: secondSignal})
}
