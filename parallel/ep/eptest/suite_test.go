package eptest_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// The suite must reject broken paths: each mutant of the collective
// dispatcher breaks one promise of the contract, and CheckAll must fail
// with an error naming it. (The suite's run on the correct dispatcher is
// parallel/ep's TestConformance.)

func dispatcher(c eptest.Config) (*ep.Dispatcher, error) {
	d, err := ep.NewDispatcher(c.Backend, c.Group, c.Experts, c.Stream)
	if err != nil {
		return nil, err
	}
	if err := d.SetTokenGroup(c.Tokens); err != nil {
		return nil, err
	}
	d.SetMaxTokens(c.MaxTokens)
	return d, nil
}

// noisyCombine perturbs the third combine of each path (a scenario's
// first repeat of step 0) by one part in 2^20: within the float32
// tolerance, but not the same bits.
type noisyCombine struct {
	*ep.Dispatcher
	b     tensor.Backend
	calls *atomic.Int64
}

func (p noisyCombine) Combine(out, y, w *tensor.Tensor, h *ep.Handle) error {
	if err := p.Dispatcher.Combine(out, y, w, h); err != nil {
		return err
	}
	if p.calls.Add(1) == 3 {
		p.b.Scale(out, out, 1+1.0/(1<<20))
	}
	return nil
}

// noSort leaves the rows in the received order.
type noSort struct{ *ep.Dispatcher }

func (p noSort) SortByExpert(dst, recv *tensor.Tensor, h *ep.Handle) {
	p.Dispatcher.SortByExpert(dst, recv, h)
	p.Dispatcher.UnsortByExpert(dst, recv, h) // the inverse permutation instead
}

func runMutant(t *testing.T, P, W int, dt tensor.DType, async bool, newPath eptest.NewPath, opts ...func(*eptest.Rank)) error {
	t.Helper()
	lopts := []local.Option{local.WithTimeout(10 * time.Second)}
	if async {
		lopts = append(lopts, local.Async())
	}
	return local.Run(W, func(world comm.Comm) error {
		r := eptest.Rank{Group: world, Backend: cpu.New(cpu.WithThreads(1)), NewPath: newPath, DType: dt, Seed: 5, Logf: t.Logf}
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
		return r.CheckAll()
	}, lopts...)
}

func TestSuiteRejectsBrokenPaths(t *testing.T) {
	for _, m := range []struct {
		name  string
		P, W  int
		dt    tensor.DType
		async bool
		path  eptest.NewPath
		want  string
	}{
		{"nondeterministic combine", 2, 2, tensor.Float32, false, func(c eptest.Config) (ep.ExpertPath, error) {
			d, err := dispatcher(c)
			return noisyCombine{d, c.Backend, new(atomic.Int64)}, err
		}, "expected identical bits"},
		{"no sort", 2, 2, tensor.Float64, false, func(c eptest.Config) (ep.ExpertPath, error) {
			d, err := dispatcher(c)
			return noSort{d}, err
		}, "SortByExpert: row"},
		{"no bound", 2, 2, tensor.Float64, false, func(c eptest.Config) (ep.ExpertPath, error) {
			c.MaxTokens = 0
			d, err := dispatcher(c)
			return d, err
		}, "was accepted, expected an error naming both numbers"},
		{"token group ignored", 1, 2, tensor.Float64, false, func(c eptest.Config) (ep.ExpertPath, error) {
			c.Tokens = nil
			d, err := dispatcher(c)
			return d, err
		}, "TokenGroup is"},
	} {
		t.Run(m.name, func(t *testing.T) {
			err := runMutant(t, m.P, m.W, m.dt, m.async, m.path)
			if err == nil || !strings.Contains(err.Error(), m.want) {
				t.Fatalf("the suite on a path with %s: %v, expected an error containing %q", m.name, err, m.want)
			}
		})
	}
}

// A Config the path refuses with errors.ErrUnsupported skips the scenario
// and says so; Unbounded skips CheckMaxTokens.
func TestSuiteSkipsUnsupported(t *testing.T) {
	var skipped atomic.Int64
	err := runMutant(t, 1, 2, tensor.Float64, false, func(c eptest.Config) (ep.ExpertPath, error) {
		if c.Tokens != nil {
			return nil, fmt.Errorf("no token group: %w", errors.ErrUnsupported)
		}
		return dispatcher(c)
	}, func(r *eptest.Rank) {
		r.Unbounded = true
		r.Logf = func(format string, args ...any) {
			if strings.Contains(fmt.Sprintf(format, args...), "skipped") {
				skipped.Add(1)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every scenario that applies to EP 1, and CheckMaxTokens, on 2 ranks.
	want := 0
	for _, sc := range eptest.Scenarios() {
		if sc.Applies(1) {
			want++
		}
	}
	if got := skipped.Load(); got != int64(2*(want+1)) {
		t.Fatalf("%d skips reported, expected %d", got, 2*(want+1))
	}
}
