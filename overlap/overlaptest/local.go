package overlaptest

import (
	"fmt"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// RunLocal runs the whole suite for s on goroutine ranks over comm/local,
// for each group size, in float32 and float64 on the CPU backend. async
// makes the transport return before ops complete (local.Async), so a
// strategy that reads a result before waiting fails (and the race detector
// sees it).
func RunLocal(t *testing.T, s overlap.Strategy, sizes []int, async bool) {
	t.Helper()
	for _, p := range sizes {
		for _, dt := range []tensor.DType{tensor.Float64, tensor.Float32} {
			t.Run(fmt.Sprintf("%s/P=%d/%v", s.Name(), p, dt), func(t *testing.T) {
				opts := []local.Option{local.WithTimeout(30 * time.Second)}
				if async {
					opts = append(opts, local.Async())
				}
				err := local.Run(p, func(g comm.Comm) error {
					b := cpu.New(cpu.WithThreads(1))
					r := Rank{Group: g, Backend: b, Strategy: s, DType: dt, Seed: uint64(7 + p)}
					if err := r.CheckAll(); err != nil {
						return err
					}
					return b.Err()
				}, opts...)
				if err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
