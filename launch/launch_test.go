package launch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/tensor"
)

// A world of one tcp process: no store, a CPU backend, the grid of one
// rank; an unknown transport is refused naming the valid ones.
func TestOpenAlone(t *testing.T) {
	info := rendezvous.Info{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}
	w, err := Open(context.Background(), info, Options{Transport: TCP, Timeout: time.Second, DP: 1, TP: 1, EP: 1})
	if err != nil {
		t.Fatal(err)
	}
	if w.Store != nil || w.Grid == nil || w.Grid.TPGroup.Size() != 1 || w.Backend == nil || w.DType != tensor.Float32 || w.Stream != nil {
		t.Errorf("world of one: store %v, grid %+v, backend %v, dtype %v, stream %v", w.Store, w.Grid, w.Backend, w.DType, w.Stream)
	}
	if err := w.Close(); err != nil {
		t.Error(err)
	}
	_, err = Open(context.Background(), info, Options{Transport: "carrier-pigeon"})
	if err == nil || !strings.Contains(err.Error(), `transport "carrier-pigeon": expected one of tcp, nccl, nvshmem`) {
		t.Errorf("an unknown transport: %v, want an error naming the valid ones", err)
	}
}

// Goroutine ranks get their grid and backend; a rank's failure names it.
func TestGoroutines(t *testing.T) {
	err := Goroutines(4, Options{Timeout: 10 * time.Second, DP: 2, TP: 2, EP: 1}, func(w *World) error {
		if w.Grid.TPGroup.Size() != 2 || w.Grid.DPGroup.Size() != 2 {
			t.Errorf("rank %d: tp %d, dp %d, want 2 and 2", w.Info.Rank, w.Grid.TPGroup.Size(), w.Grid.DPGroup.Size())
		}
		x := tensor.MustHost(tensor.Float32, 1)
		x.F32()[0] = float32(w.Info.Rank + 1)
		wk, err := w.Grid.DPGroup.AllReduce(x, comm.Sum, nil)
		if err == nil {
			err = wk.Wait(nil)
		}
		if want := float32(w.Info.Rank%2+1) + float32(w.Info.Rank%2+3); err == nil && x.F32()[0] != want {
			t.Errorf("rank %d: dp all-reduce %v, want %v", w.Info.Rank, x.F32()[0], want)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = Goroutines(2, Options{Timeout: 5 * time.Second, DP: 2, TP: 1, EP: 1}, func(w *World) error {
		if w.Info.Rank == 1 {
			return context.Canceled
		}
		return w.Comm.Barrier()
	})
	if err == nil || !strings.Contains(err.Error(), "rank 1: context canceled") {
		t.Errorf("a failing rank: %v, want an error naming rank 1", err)
	}
}
