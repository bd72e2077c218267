package launch

import (
	"context"
	"fmt"
	"go/build"
	"net"
	"slices"
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

// Process ranks learn their hosts at the rendezvous: four tcp ranks (as
// goroutines of this test) whose host identities say {0, 1} and {2, 3}
// share a host; every rank gets the same placement, its local ranks and
// the summary of the start-up report, with the launcher's count of ranks
// per node checked against it.
func TestHostsAtRendezvous(t *testing.T) {
	port := freePort(t)
	ids := []string{"node-a", "node-a", "node-b", "node-b"}
	errs := make(chan error, 4)
	summaries := make([]string, 4)
	for r := range 4 {
		go func() {
			info := rendezvous.Info{Rank: r, WorldSize: 4, LocalRank: r % 2, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port, JobID: "hosts", Source: "asynctp"}
			getenv := func(k string) string {
				if k == EnvHostID {
					return ids[r]
				}
				return ""
			}
			w, err := Open(context.Background(), info, Options{Transport: TCP, Timeout: 20 * time.Second, Getenv: getenv, DP: 2, TP: 2, EP: 1})
			if err != nil {
				errs <- err
				return
			}
			defer w.Close()
			local := []int{0, 1}
			if r >= 2 {
				local = []int{2, 3}
			}
			if !slices.Equal(w.Hosts, []int{0, 0, 1, 1}) || !slices.Equal(w.HostNames, []string{"node-a", "node-b"}) || !slices.Equal(w.LocalRanks(), local) {
				errs <- fmt.Errorf("rank %d: hosts %v %v, local ranks %v; want [0 0 1 1] [node-a node-b] %v", r, w.Hosts, w.HostNames, w.LocalRanks(), local)
				return
			}
			summaries[r] = w.HostSummary()
			errs <- w.Comm.Barrier()
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if want := "2 (ranks 0-1 on node-a, ranks 2-3 on node-b)"; summaries[0] != want {
		t.Errorf("summary %q, want %q", summaries[0], want)
	}
	w := &World{Info: rendezvous.Info{Rank: 1, LocalWorldSize: 4}, Hosts: []int{0, 0, 1, 1}, HostNames: []string{"a", "b"}}
	if s := w.HostSummary(); !strings.Contains(s, "the launcher counts 4 ranks on this rank's node, the host identities 2") {
		t.Errorf("a launcher's count that disagrees: %q, want it said", s)
	}
	if hosts, names := hostsOf([]string{"h|boot|net:[1]", "h|boot|net:[2]", "h|boot|net:[1]", "g|x"}); !slices.Equal(hosts, []int{0, 1, 0, 2}) || !slices.Equal(names, []string{"h", "h#2", "g"}) {
		t.Errorf("hostsOf: %v %v, want [0 1 0 2] [h h#2 g]", hosts, names)
	}
	if got := rankRanges([]int{0, 1, 2, 3, 6, 8, 9}); got != "0-3, 6, 8-9" {
		t.Errorf("rankRanges: %q", got)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// cmd/train and cmd/ablate open no transport themselves (this package
// does): none of their files but the tests imports a transport.
func TestCommandsOpenNoTransport(t *testing.T) {
	transports := []string{"comm/local", "comm/tcp", "comm/nccl", "comm/nvshmem", "comm/hybrid"}
	for _, dir := range []string{"../cmd/train", "../cmd/ablate"} {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range pkg.Imports {
			for _, tr := range transports {
				if imp == "github.com/asynctp/asynctp/"+tr {
					t.Errorf("%s imports %s: expected its worlds opened by package launch", dir, imp)
				}
			}
		}
	}
}
