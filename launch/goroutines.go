package launch

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/tensor"
)

// Goroutines runs fn on each rank of a world of n goroutine ranks over
// comm/local, each with its World: its CPU backend (o.CPU, with its share
// of the cores) and its grid (o.DP, o.TP, o.EP), closed when fn returns.
// It returns the ranks' errors joined, root causes first. A rank that
// fails aborts the world, so the others stop at their next collective with
// an error naming it; a rank that stalls makes the others fail at the
// deadline (o.Timeout), naming it. Once a rank has failed, Goroutines
// waits at most o.Timeout for the rest: a rank still running then is
// reported as stalled (and left behind).
func Goroutines(n int, o Options, fn func(w *World) error) error {
	o.defaults()
	threads := max(1, runtime.GOMAXPROCS(0)/n)
	return Ranks(n, o.Timeout, func(c comm.Comm) error {
		w := &World{Info: rendezvous.Info{Rank: c.Rank(), WorldSize: n, LocalRank: c.Rank(), LocalWorldSize: n, Source: "goroutines"},
			Transport: Local, Comm: c, DType: tensor.Float32,
			Device: fmt.Sprintf("cpu, %d ranks as goroutines (%d threads each)", n, threads)}
		w.Hosts, w.HostNames = make([]int, n), []string{"this process"}
		if o.Hosts != nil {
			if len(o.Hosts) != n {
				return fmt.Errorf("launch: Options.Hosts has %d ranks' hosts, the world %d ranks", len(o.Hosts), n)
			}
			ids := make([]string, n)
			for r, h := range o.Hosts {
				ids[r] = fmt.Sprintf("host %d", h)
			}
			w.Hosts, w.HostNames = hostsOf(ids)
		}
		b, err := cpuBackend(o, c.Rank(), threads)
		if err != nil {
			return err
		}
		w.Backend = b
		if o.DP > 0 || o.TP > 0 || o.EP > 0 {
			if w.Grid, err = comm.NewGrid(c, o.DP, o.TP, o.EP); err != nil {
				return err
			}
			defer w.Grid.Close()
		}
		return fn(w)
	})
}

// Ranks runs fn on each rank of a new comm/local world of n ranks with the
// collective deadline timeout, one goroutine per rank (see Goroutines,
// which adds each rank's backend and grid).
func Ranks(n int, timeout time.Duration, fn func(c comm.Comm) error) error {
	ranks := local.NewWorld(n, local.WithTimeout(timeout))
	type result struct {
		rank int
		err  error
	}
	done := make(chan result, n)
	for r, c := range ranks {
		go func() {
			var err error
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("rank %d panicked: %v\n%s", r, p, debug.Stack())
					abort(c, err)
				}
				done <- result{r, err}
			}()
			if err = fn(c); err != nil {
				err = fmt.Errorf("rank %d: %w", r, err)
				abort(c, err)
			}
		}()
	}
	errs := make([]error, n)
	returned := make([]bool, n)
	var deadline <-chan time.Time
	for left := n; left > 0; {
		select {
		case res := <-done:
			returned[res.rank], errs[res.rank] = true, res.err
			left--
			if res.err != nil && deadline == nil {
				deadline = time.After(timeout)
			}
		case <-deadline:
			for r := range n {
				if !returned[r] {
					errs[r] = fmt.Errorf("rank %d: stalled: still running %v after the first failure (the collective deadline, --comm-timeout)", r, timeout)
				}
			}
			left = 0
		}
	}
	for r, c := range ranks {
		if returned[r] {
			c.Close()
		}
	}
	// Root causes first: stalled ranks and the ranks' own failures, then
	// the deadlines that name a missing rank, then the ranks that were only
	// woken by an abort or a closed peer.
	rank := func(err error) int {
		switch {
		case err == nil:
			return 3
		case errors.Is(err, comm.ErrAborted), errors.Is(err, comm.ErrClosed):
			return 2
		case errors.Is(err, comm.ErrTimeout):
			return 1
		}
		return 0
	}
	slices.SortStableFunc(errs, func(a, b error) int { return cmp.Compare(rank(a), rank(b)) })
	return errors.Join(errs...)
}

func abort(c comm.Comm, err error) {
	if a, ok := c.(comm.Aborter); ok {
		a.Abort(err)
	}
}
