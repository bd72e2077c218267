package launch

import (
	"context"
	"fmt"
	"time"

	"github.com/asynctp/asynctp/comm/hybrid"
	"github.com/asynctp/asynctp/comm/nccl"
	"github.com/asynctp/asynctp/comm/nvshmem"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The GPU ranks: each on GPU local_rank % (GPUs of its node), with the
// CUDA backend (bf16, fp32 master weights) and an NCCL or NVSHMEM world.

// Preflight loads the library of a GPU transport in a launcher, so that a
// missing one fails the launch once, before any process starts, with the
// transport's error (the library and the variable that overrides its
// path); for NCCL it also refuses more ranks than GPUs.
func Preflight(transport string, nproc int) error {
	switch transport {
	case NCCL:
		if _, err := nccl.Load(); err != nil {
			return err
		}
		if err := cuda.Init(); err != nil {
			return fmt.Errorf("--comm nccl: %w", err)
		}
		if n, err := cuda.DeviceCount(); err == nil && nproc > n {
			return fmt.Errorf("--comm nccl: --nproc %d ranks but %d GPU(s): NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\"); use --comm nvshmem, whose ranks may share a GPU, or --nproc %d or fewer", nproc, n, n)
		}
	case NVSHMEM:
		_, err := nvshmem.Load()
		return err
	case Hybrid:
		if _, err := nvshmem.Load(); err != nil {
			return err
		}
		return Preflight(NCCL, nproc)
	}
	return nil
}

// gpuFor picks the GPU of a rank and returns the number of GPUs of the node.
func gpuFor(info rendezvous.Info) (device, count int, err error) {
	if err := cuda.Init(); err != nil {
		return 0, 0, err
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return 0, 0, err
	}
	if n < 1 {
		return 0, 0, fmt.Errorf("no CUDA device")
	}
	return info.LocalRank % n, n, nil
}

// ncclGPU picks the GPU of a rank of transport, which runs NCCL: two ranks
// on one GPU are refused before NCCL would ("Duplicate GPU detected").
func ncclGPU(transport string, info rendezvous.Info) (int, error) {
	dev, n, err := gpuFor(info)
	if err != nil {
		return 0, fmt.Errorf("--comm %s: %w", transport, err)
	}
	if info.LocalWorldSize > n {
		return 0, fmt.Errorf("--comm %s: %d ranks on this node but %d GPU(s): NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\"); use --comm nvshmem, whose ranks may share a GPU, or at most %d ranks per node",
			transport, info.LocalWorldSize, n, n)
	}
	return dev, nil
}

// gpuBackend opens the rank's CUDA backend on dev.
func gpuBackend(w *World, o Options, dev int) (*cudabackend.Backend, error) {
	b, err := cudabackend.New(dev, o.CUDA...)
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w", err)
	}
	w.Backend, w.DType = b, tensor.BFloat16
	return b, nil
}

// openNCCL: one GPU per rank (ncclGPU). The library is loaded first, so
// that a missing one is the first error, as the transport words it.
func openNCCL(ctx context.Context, w *World, o Options) error {
	lib, err := nccl.Load()
	if err != nil {
		return err
	}
	info := w.Info
	dev, err := ncclGPU(NCCL, info)
	if err != nil {
		return err
	}
	b, err := gpuBackend(w, o, dev)
	if err != nil {
		return err
	}
	c, err := nccl.New(ctx, w.Store, info.Rank, info.WorldSize, dev, nccl.WithTimeout(o.Timeout))
	if err != nil {
		b.Close()
		return err
	}
	w.later(c.Close)
	w.later(func() error { b.Close(); return nil })
	how := ""
	w.Comm, w.Stream, how = gpuWorld(c, b, o.Getenv)
	w.Device = fmt.Sprintf("%s, bf16 with fp32 master weights; %d ranks as processes over %v; %s", b.DeviceName(), info.WorldSize, lib, how)
	return nil
}

// Heartbeats of the NVSHMEM ranks (rendezvous.Liveness): NVSHMEM does not
// notice a lost peer (its kernels wait for it until the op deadline) and
// cannot abort, so a rank learns of a peer's death or failure through the
// store and exits.
const (
	nvshmemHeartbeat  = time.Second
	nvshmemLostAfter  = 15 * time.Second
	nvshmemLivePrefix = "asynctp/train/live"
)

// ExitGrace is how long a rank whose NVSHMEM world failed may take to
// return its error before it exits anyway (Options.Exit): NVSHMEM cannot
// abort a kernel or a host call that waits for a peer that is gone.
const ExitGrace = 10 * time.Second

// openNVSHMEM: ranks on GPU local_rank % GPUs, several per GPU allowed. The
// library is loaded first, so that a missing one is the first error, as
// the transport words it.
func openNVSHMEM(ctx context.Context, w *World, o Options) error {
	if _, err := nvshmem.Load(); err != nil {
		return err
	}
	info := w.Info
	dev, n, err := gpuFor(info)
	if err != nil {
		return fmt.Errorf("--comm nvshmem: %w", err)
	}
	b, err := gpuBackend(w, o, dev)
	if err != nil {
		return err
	}
	c, err := joinNVSHMEM(ctx, w, o, b, dev)
	if err != nil {
		return err
	}
	shared := ""
	if info.LocalWorldSize > n {
		shared = fmt.Sprintf(", %d ranks share each GPU", (info.LocalWorldSize+n-1)/n)
	}
	how := ""
	w.Comm, w.Stream, how = gpuWorld(c, b, o.Getenv)
	w.Device = fmt.Sprintf("%s, bf16 with fp32 master weights; %d ranks as processes over %v%s; %s", b.DeviceName(), info.WorldSize, c.Report().Library, shared, how)
	return nil
}

// joinNVSHMEM makes this rank a PE of an NVSHMEM world bootstrapped by
// unique id through the store, on device dev, with the heartbeats that
// tell it of a lost peer (when o.Exit is set: it then prints why and
// exits). Its Close and the backend's are added to w's.
func joinNVSHMEM(ctx context.Context, w *World, o Options, b *cudabackend.Backend, dev int) (*nvshmem.Comm, error) {
	info := w.Info
	exitLater := func() {
		if o.Exit == nil {
			return
		}
		time.AfterFunc(ExitGrace, func() {
			fmt.Fprintf(o.Log, "train: rank %d: exiting: the NVSHMEM world cannot be aborted\n", info.Rank)
			o.Exit(1)
		})
	}
	c, err := nvshmem.New(ctx, w.Store, info.Rank, info.WorldSize, dev, nvshmem.WithTimeout(o.Timeout),
		nvshmem.WithOnFailure(func(err error) {
			fmt.Fprintf(o.Log, "train: rank %d: the NVSHMEM world failed: %v\n", info.Rank, err)
			exitLater()
		}))
	if err != nil {
		b.Close()
		return nil, err
	}
	w.Report = c.Report().String()
	var watch *rendezvous.Liveness
	if w.Store != nil && info.WorldSize > 1 && o.Exit != nil {
		exit := func(err error) {
			fmt.Fprintf(o.Log, "train: rank %d: %v\n", info.Rank, err)
			o.Exit(1) // the peers' kernels and NVSHMEM's calls would wait for it
		}
		// Started after nvshmem.New, which every rank has joined: a peer
		// that never beats is gone too (FromStart).
		watch, err = rendezvous.StartLiveness(w.Store, rendezvous.LivenessConfig{
			Prefix: nvshmemLivePrefix, Rank: info.Rank, Size: info.WorldSize,
			Interval: nvshmemHeartbeat, Lost: min(nvshmemLostAfter, o.Timeout), FromStart: true,
			OnGone:  exit,
			OnAbort: func(from int, msg string) { exit(fmt.Errorf("world rank %d failed: %s", from, msg)) },
		})
		if err != nil {
			c.Close()
			b.Close()
			return nil, err
		}
	}
	w.later(func() error {
		if watch != nil {
			watch.Close(true)
		}
		return nil
	})
	w.later(c.Close)
	w.later(func() error { b.Close(); return nil })
	w.fail = func(err error) {
		if watch != nil {
			watch.Abort(err)
			watch.Close(false)
		}
		exitLater() // in case returning the error blocks
	}
	return c, nil
}

// Library loads the GPU library of transport (NCCL's, NVSHMEM's, or both
// for the hybrid) and describes it; the error names the library and the
// variable that overrides its path. "" for the CPU transports.
func Library(transport string) (string, error) {
	switch transport {
	case NCCL:
		l, err := nccl.Load()
		if err != nil {
			return "", err
		}
		return l.String(), nil
	case NVSHMEM:
		l, err := nvshmem.Load()
		if err != nil {
			return "", err
		}
		return l.String(), nil
	case Hybrid:
		a, err := Library(NCCL)
		if err != nil {
			return "", err
		}
		b, err := Library(NVSHMEM)
		if err != nil {
			return "", err
		}
		return a + " and " + b, nil
	}
	return "", nil
}

// openHybrid: one GPU per rank (NCCL's rule, ncclGPU); NCCL's world for every
// collective and an NVSHMEM world of the same processes, its unique id
// through the same store, for symmetric memory (comm/hybrid). Both
// libraries are loaded first, so that a missing one is the first error.
func openHybrid(ctx context.Context, w *World, o Options) error {
	nl, err := nccl.Load()
	if err != nil {
		return err
	}
	if _, err := nvshmem.Load(); err != nil {
		return err
	}
	info := w.Info
	dev, err := ncclGPU(Hybrid, info)
	if err != nil {
		return err
	}
	b, err := gpuBackend(w, o, dev)
	if err != nil {
		return err
	}
	nc, err := nccl.New(ctx, w.Store, info.Rank, info.WorldSize, dev, nccl.WithTimeout(o.Timeout))
	if err != nil {
		b.Close()
		return err
	}
	sym, err := joinNVSHMEM(ctx, w, o, b, dev)
	if err != nil {
		nc.Close()
		return err
	}
	// Symmetric memory inside a host only: a group that spans hosts keeps
	// its sites on NCCL's collectives.
	h, err := hybrid.New(nc, sym, hybrid.WithHosts(w.Hosts))
	if err != nil {
		nc.Close()
		return err
	}
	// NCCL's world closes before NVSHMEM's, which finalises (joinNVSHMEM
	// queued its close and the backend's).
	w.closes = append([]func() error{nc.Close}, w.closes...)
	how := ""
	w.Comm, w.Stream, how = gpuWorld(h, b, o.Getenv)
	rep := sym.Report()
	w.Device = fmt.Sprintf("%s, bf16 with fp32 master weights; %d ranks as processes; collectives over %v, symmetric memory over NVSHMEM %v (%d host(s), %d P2P peer(s) of rank %d, %d remote); %s",
		b.DeviceName(), info.WorldSize, nl, rep.Library.NVSHMEM, rep.Hosts, rep.SameGPU+rep.OtherGPU, info.Rank, rep.Remote, how)
	return nil
}
