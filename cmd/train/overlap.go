package main

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// overlapStrategies are the site strategies this run can build, beside
// collective, and why the others cannot be built. The decomposed
// (pipelined) strategy runs on every transport; on NVSHMEM the GPU
// processes use its peer-copy form (gpuOverlap).
func overlapStrategies(cfg Config) ([]overlap.Strategy, map[string]string) {
	missing := map[string]string{
		"fused": "the fused kernels (our GEMM with flag waits in its producer warp) are not built yet; collective and pipelined run",
	}
	return []overlap.Strategy{overlap.Pipelined{}}, missing
}

// newChooser is one rank's chooser of the site strategies; extra are the
// strategies of this rank's transport and backend (GPU ones) that take
// the place of the generic ones of the same name.
func newChooser(cfg Config, extra ...overlap.Strategy) (*overlap.Chooser, error) {
	avail, missing := overlapStrategies(cfg)
	for _, s := range extra {
		for i, a := range avail {
			if a.Name() == s.Name() {
				avail[i] = s
				s = nil
				break
			}
		}
		if s != nil {
			avail = append(avail, s)
		}
	}
	return overlap.NewChooser(cfg.Overlap, avail, missing)
}

// checkOverlap refuses, before any work, an overlap configuration that
// names a strategy this run cannot build.
func checkOverlap(cfg Config) error {
	_, err := newChooser(cfg)
	return err
}

// printOverlap prints which strategy each site kind got (world rank 0).
func printOverlap(ch *overlap.Chooser) {
	for _, line := range ch.Summary() {
		fmt.Println("overlap:", line)
	}
}

// gpuOverlap is the GPU form of the strategies for this rank: on a
// transport with symmetric memory (NVSHMEM) and the CUDA backend, the
// pipelined strategy moves its chunks by copy-engine pulls from peer
// pointers (overlap/peercopy) instead of exchanges through the transport.
func gpuOverlap(c comm.Comm, b tensor.Backend) []overlap.Strategy {
	cb, ok := b.(*cudabackend.Backend)
	if !ok || cb.Stream() == nil {
		return nil
	}
	if _, ok := comm.SymmetricOf(c); !ok {
		return nil
	}
	return []overlap.Strategy{peercopy.Pipelined{}}
}
