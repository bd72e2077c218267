package eptest

import (
	"fmt"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// RunLocal runs the whole suite (CheckAll) for the implementation newPath
// builds, on goroutine ranks over comm/local with the CPU backend, in
// float64 and float32:
//
//   - for each EP size in sizes, over a world of that many ranks (the token
//     group is the EP group), with synchronous collectives and with
//     local.Async (ops complete only at Work.Wait, so a path that reads a
//     result before waiting fails, and the race detector sees it);
//   - for each EP size, the token group twice as wide: a world of 2·P
//     ranks split by comm.Grid into two EP groups of P, the world as the
//     token group (capacity and drops over both groups' tokens, in world
//     order).
//
// opts are applied to the Rank of every run (set Unbounded, say).
func RunLocal(t *testing.T, newPath NewPath, sizes []int, opts ...func(*Rank)) {
	t.Helper()
	for _, P := range sizes {
		for _, dt := range []tensor.DType{tensor.Float64, tensor.Float32} {
			for _, async := range []bool{false, true} {
				t.Run(fmt.Sprintf("ep=%d/%v/async=%v", P, dt, async), func(t *testing.T) {
					run(t, newPath, P, P, dt, async, opts)
				})
			}
			t.Run(fmt.Sprintf("ep=%d/tokens=%d/%v", P, 2*P, dt), func(t *testing.T) {
				run(t, newPath, P, 2*P, dt, true, opts)
			})
		}
	}
}

// run runs CheckAll on W goroutine ranks, in EP groups of P (the world as
// the token group when W > P).
func run(t *testing.T, newPath NewPath, P, W int, dt tensor.DType, async bool, opts []func(*Rank)) {
	t.Helper()
	lopts := []local.Option{local.WithTimeout(30 * time.Second)}
	if async {
		lopts = append(lopts, local.Async())
	}
	err := local.Run(W, func(world comm.Comm) error {
		b := cpu.New(cpu.WithThreads(1))
		r := Rank{Group: world, Backend: b, NewPath: newPath, DType: dt, Seed: uint64(31 + 7*P + W), Logf: t.Logf}
		if W > P {
			g, err := comm.NewGrid(world, W, 1, P)
			if err != nil {
				return err
			}
			defer g.Close()
			r.Group, r.Tokens = g.EPGroup, world
		}
		for _, o := range opts {
			o(&r)
		}
		if err := r.CheckAll(); err != nil {
			return err
		}
		return b.Err()
	}, lopts...)
	if err != nil {
		t.Fatal(err)
	}
}
