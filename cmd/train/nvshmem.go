package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/asynctp/asynctp/comm/nvshmem"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The NVSHMEM wiring of the GPU process ranks, kept in this file.

// Heartbeats of the NVSHMEM ranks (rendezvous.Liveness): NVSHMEM does not
// notice a lost peer (its kernels wait for it until the op deadline) and
// cannot abort, so a rank learns of a peer's death or failure through the
// store and exits.
const (
	nvshmemHeartbeat  = time.Second
	nvshmemLostAfter  = 15 * time.Second
	nvshmemLivePrefix = "asynctp/train/live"
)

// exitGrace is how long a rank whose NVSHMEM world failed may take to
// return its error before it exits anyway: NVSHMEM cannot abort a kernel
// or a host call that waits for a peer that is gone.
const exitGrace = 10 * time.Second

func preflightNVSHMEM() error {
	_, err := nvshmem.Load()
	return err
}

// openNVSHMEM: ranks on GPU local_rank % GPUs, several per GPU allowed. The
// library is loaded first, so that a missing one is the first error, as
// the transport words it. The store watch (rendezvous.Liveness) tells a rank that a
// peer died or failed: it then prints why and exits.
func openNVSHMEM(ctx context.Context, cfg Config, env rankEnv) (*transport, error) {
	lib, err := nvshmem.Load()
	if err != nil {
		return nil, err
	}
	info := env.info
	dev, n, err := gpuFor(info)
	if err != nil {
		return nil, fmt.Errorf("--comm nvshmem: %w", err)
	}
	opts, _, _, err := cudaOptions(cfg.GroupedGEMM)
	if err != nil {
		return nil, err
	}
	b, err := cudabackend.New(dev, opts...)
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w", err)
	}
	exitLater := func() {
		time.AfterFunc(exitGrace, func() {
			fmt.Fprintf(os.Stderr, "train: rank %d: exiting: the NVSHMEM world cannot be aborted\n", info.Rank)
			os.Exit(1)
		})
	}
	timeout := time.Duration(cfg.Parallel.CommTimeout)
	c, err := nvshmem.New(ctx, env.store, info.Rank, info.WorldSize, dev, nvshmem.WithTimeout(timeout),
		nvshmem.WithOnFailure(func(err error) {
			fmt.Fprintf(os.Stderr, "train: rank %d: the NVSHMEM world failed: %v\n", info.Rank, err)
			exitLater()
		}))
	if err != nil {
		b.Close()
		return nil, err
	}
	var watch *rendezvous.Liveness
	if env.store != nil && info.WorldSize > 1 {
		exit := func(err error) {
			fmt.Fprintf(os.Stderr, "train: rank %d: %v\n", info.Rank, err)
			os.Exit(1) // the peers' kernels and NVSHMEM's calls would wait for it
		}
		// Started after nvshmem.New, which every rank has joined: a peer
		// that never beats is gone too (FromStart).
		watch, err = rendezvous.StartLiveness(env.store, rendezvous.LivenessConfig{
			Prefix: nvshmemLivePrefix, Rank: info.Rank, Size: info.WorldSize,
			Interval: nvshmemHeartbeat, Lost: min(nvshmemLostAfter, timeout), FromStart: true,
			OnGone:  exit,
			OnAbort: func(from int, msg string) { exit(fmt.Errorf("world rank %d failed: %s", from, msg)) },
		})
		if err != nil {
			c.Close()
			b.Close()
			return nil, err
		}
	}
	shared := ""
	if info.LocalWorldSize > n {
		shared = fmt.Sprintf(", %d ranks share each GPU", (info.LocalWorldSize+n-1)/n)
	}
	world, stream, how := gpuWorld(c, b)
	t := &transport{world: world, stream: stream, b: b, dt: tensor.BFloat16,
		note: fmt.Sprintf("%s, bf16 with fp32 master weights; %d ranks as processes over %v%s; %s", b.DeviceName(), info.WorldSize, lib, shared, how)}
	t.close = func() {
		if watch != nil {
			watch.Close(true)
		}
		c.Close()
		b.Close()
	}
	t.fail = func(err error) {
		if watch != nil {
			watch.Abort(err)
			watch.Close(false)
		}
		exitLater() // in case returning the error blocks
	}
	return t, nil
}
