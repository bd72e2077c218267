package commtest

import (
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// Memory moves test data between the host and the memory a transport works
// on. The suite builds its inputs on the host, uploads them, runs the ops,
// and downloads the results to compare them with a host reference.
type Memory interface {
	// Alloc returns a zeroed tensor in the transport's memory.
	Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error)
	// Upload copies the host tensor src into dst.
	Upload(dst, src *tensor.Tensor) error
	// Download copies src into the host tensor dst, after the work queued on
	// the suite's stream (WithStream) has finished.
	Download(dst, src *tensor.Tensor) error
}

// HostMemory is Memory for transports that move host tensors (comm/local).
func HostMemory() Memory { return hostMemory{} }

type hostMemory struct{}

func (hostMemory) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	return tensor.Host(dt, shape...)
}

func (hostMemory) Upload(dst, src *tensor.Tensor) error   { return hostCopy(dst, src) }
func (hostMemory) Download(dst, src *tensor.Tensor) error { return hostCopy(dst, src) }

func hostCopy(dst, src *tensor.Tensor) error {
	v, err := src.Float64s()
	if err != nil {
		return err
	}
	return dst.SetFloat64s(v)
}

// BackendMemory is Memory on the device of a tensor.Backend (a GPU
// transport's tests pass the CUDA backend whose stream they also pass to
// WithStream).
func BackendMemory(b tensor.Backend) Memory { return backendMemory{b} }

type backendMemory struct{ b tensor.Backend }

func (m backendMemory) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	t := m.b.Zeros(dt, shape...)
	return t, m.b.Err()
}

func (m backendMemory) Upload(dst, src *tensor.Tensor) error {
	m.b.Upload(dst, src)
	return m.b.Sync()
}

func (m backendMemory) Download(dst, src *tensor.Tensor) error {
	m.b.Download(dst, src)
	return m.b.Sync()
}

// Option configures the suite.
type Option func(*config)

type config struct {
	sizes    []int
	mem      Memory
	stream   comm.Stream
	seed     uint64
	mismatch bool
	missing  func(t *testing.T, n int) []comm.Comm
	timeout  time.Duration
}

// Sizes sets the world sizes Run tries (default 1 to 8).
func Sizes(ns ...int) Option { return func(c *config) { c.sizes = ns } }

// WithMemory sets where the suite's tensors live (default HostMemory).
func WithMemory(m Memory) Option { return func(c *config) { c.mem = m } }

// WithStream sets the stream passed to every op and to Work.Wait (default
// nil).
func WithStream(s comm.Stream) Option { return func(c *config) { c.stream = s } }

// Seed sets the seed of the inputs (default 1). Every rank derives the
// inputs of every other rank from it, so all ranks must use the same seed.
func Seed(seed uint64) Option { return func(c *config) { c.seed = seed } }

// Mismatch adds the cases where ranks disagree: different ops, sizes or
// all-to-all counts in the same call. Every rank must fail with an error
// wrapping comm.ErrMismatch. For transports that can detect it (comm/local);
// NCCL cannot.
func Mismatch() Option { return func(c *config) { c.mismatch = true } }

// MissingRank adds the fault cases of an in-process transport, each on a
// fresh world of 3 ranks from newWorld, whose blocking calls must time out
// after timeout:
//   - rank 2 never calls: ranks 0 and 1 fail within a few timeouts with an
//     error that wraps comm.ErrTimeout and names "rank 2" and the op; after
//     that every call of rank 2 fails promptly;
//   - if the Comm is a comm.Aborter, rank 2 aborts with an error while ranks
//     0 and 1 wait: they fail well before the timeout, with an error that
//     names rank 2 and wraps the abort's error.
func MissingRank(newWorld func(t *testing.T, n int) []comm.Comm, timeout time.Duration) Option {
	return func(c *config) { c.missing, c.timeout = newWorld, timeout }
}

func newConfig(opts []Option) *config {
	cfg := &config{sizes: []int{1, 2, 3, 4, 5, 6, 7, 8}, mem: HostMemory(), seed: 1}
	for _, o := range opts {
		o(cfg)
	}
	return cfg
}

// Run runs the suite on worlds of every size, each rank on its own
// goroutine: newWorld(t, n) returns the n ranks of a fresh world, rank r at
// index r. The suite closes them.
func Run(t *testing.T, newWorld func(t *testing.T, n int) []comm.Comm, opts ...Option) {
	cfg := newConfig(opts)
	for _, n := range cfg.sizes {
		t.Run(fmt.Sprintf("size=%d", n), func(t *testing.T) {
			ranks := newWorld(t, n)
			if len(ranks) != n {
				t.Fatalf("commtest: newWorld(%d) returned %d ranks", n, len(ranks))
			}
			var wg sync.WaitGroup
			for _, c := range ranks {
				wg.Go(func() {
					runRank(t, c, cfg)
					if err := c.Close(); err != nil {
						t.Errorf("commtest: close %s rank %d: %v", c.Name(), c.Rank(), err)
					}
				})
			}
			wg.Wait()
		})
	}
	if cfg.missing != nil {
		t.Run("missing-rank", func(t *testing.T) { missingRank(t, cfg) })
		t.Run("abort", func(t *testing.T) { abortRank(t, cfg) })
	}
}

// RunRank runs the suite for one rank, on the world c: the entry point of
// transports that run one rank per process (nccl, nvshmem). Every rank of
// the world calls it at the same time with the same options; each checks its
// own results against a reference it computes from the seeded inputs of all
// ranks. It closes nothing.
func RunRank(t testing.TB, c comm.Comm, opts ...Option) {
	runRank(t, c, newConfig(opts))
}

// stop unwinds a rank's cases after a fatal failure.
type stop struct{}

// rank is one rank's view of the suite: its comm, the world (to abort on a
// fatal failure), the config and where to report.
type rank struct {
	tb    testing.TB
	c     comm.Comm
	world comm.Comm
	cfg   *config
}

func runRank(tb testing.TB, c comm.Comm, cfg *config) {
	r := &rank{tb: tb, c: c, world: c, cfg: cfg}
	r.guard(func() {
		for _, cs := range cases {
			cs(r)
		}
		if cfg.mismatch && c.Size() > 1 {
			mismatchCases(r)
		}
	})
}

var cases = []func(*rank){
	basicCase, allGatherCases, allReduceCases, reduceScatterCases, allToAllCases,
	broadcastCases, workCase, errorCases, splitCases, noColorCase, concurrentCase, gridCases,
}

// guard runs f, stopping quietly at a fatal failure.
func (r *rank) guard(f func()) {
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stop); !ok {
				panic(p)
			}
		}
	}()
	f()
}

// on returns a copy of r for the group c.
func (r *rank) on(c comm.Comm) *rank { s := *r; s.c = c; return &s }

func (r *rank) errorf(format string, args ...any) {
	r.tb.Helper()
	r.tb.Errorf("commtest: %s rank %d of %d: %s", r.c.Name(), r.c.Rank(), r.c.Size(), fmt.Sprintf(format, args...))
}

// fatalf reports, aborts the world when the transport can (so the peers do
// not wait for their deadline) and stops this rank's cases.
func (r *rank) fatalf(format string, args ...any) {
	r.tb.Helper()
	r.errorf(format, args...)
	if a, ok := r.world.(comm.Aborter); ok {
		a.Abort(errors.New("commtest: a rank failed"))
	}
	panic(stop{})
}

// done checks an op's error and waits for its work.
func (r *rank) done(what string, w comm.Work, err error) {
	r.tb.Helper()
	if err == nil {
		err = w.Wait(r.cfg.stream)
	}
	if err != nil {
		r.fatalf("%s: %v", what, err)
	}
}

// input returns the seeded values of rank q for a case: nonzero multiples of
// 1/8 up to 8 in magnitude (exact in every float dtype), or integers up to
// 100 for Int32.
func (r *rank) input(name string, q int, dt tensor.DType, n int) []float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", name, q)
	rng := testutil.Rng(r.cfg.seed ^ h.Sum64())
	out := make([]float64, n)
	for i := range out {
		v := float64(1 + rng.IntN(64))
		if dt == tensor.Int32 {
			v = float64(1 + rng.IntN(100))
		} else {
			v /= 8
		}
		if rng.IntN(2) == 0 {
			v = -v
		}
		out[i] = v
	}
	return out
}

// tensor uploads vals as a tensor of the transport's memory.
func (r *rank) tensor(dt tensor.DType, vals []float64, shape ...int) *tensor.Tensor {
	r.tb.Helper()
	t := r.alloc(dt, shape...)
	r.fill(t, vals)
	return t
}

// fill uploads vals into t.
func (r *rank) fill(t *tensor.Tensor, vals []float64) {
	r.tb.Helper()
	h := tensor.MustHost(t.DType(), t.Shape()...)
	if err := h.SetFloat64s(vals); err != nil {
		r.fatalf("input %v: %v", h, err)
	}
	if err := r.cfg.mem.Upload(t, h); err != nil {
		r.fatalf("upload %v: %v", h, err)
	}
}

func (r *rank) alloc(dt tensor.DType, shape ...int) *tensor.Tensor {
	r.tb.Helper()
	t, err := r.cfg.mem.Alloc(dt, shape...)
	if err != nil {
		r.fatalf("alloc %v%v: %v", dt, tensor.Shape(shape), err)
	}
	return t
}

func (r *rank) values(t *tensor.Tensor) []float64 {
	r.tb.Helper()
	h := tensor.MustHost(t.DType(), t.Shape()...)
	if err := r.cfg.mem.Download(h, t); err != nil {
		r.fatalf("download %v: %v", t, err)
	}
	v, _ := h.Float64s()
	return v
}

// expect compares t with want by relative norm (tol 0: exactly).
func (r *rank) expect(what string, t *tensor.Tensor, want []float64, tol float64) {
	r.tb.Helper()
	got := r.values(t)
	if len(got) != len(want) {
		r.errorf("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	if e := testutil.RelErr(got, want); !(e <= tol) {
		r.errorf("%s: relative error %.3g > %.3g\n got %v\nwant %v", what, e, tol, head(got), head(want))
	}
}

func head(v []float64) []float64 {
	if len(v) > 12 {
		return v[:12]
	}
	return v
}

// tol is the tolerance of a reduction in dt against the float64 reference.
func tol(dt tensor.DType) float64 {
	switch dt {
	case tensor.Float64:
		return 1e-12
	case tensor.Float32:
		return 1e-6
	case tensor.BFloat16:
		return 1e-2
	}
	return 0
}

// reduceRef reduces parts (one per rank, in rank order) in float64.
func reduceRef(parts [][]float64, op comm.ReduceOp) []float64 {
	out := append([]float64(nil), parts[0]...)
	for _, p := range parts[1:] {
		for i, v := range p {
			if op == comm.Max {
				out[i] = max(out[i], v)
			} else {
				out[i] += v
			}
		}
	}
	if op == comm.Avg {
		for i := range out {
			out[i] /= float64(len(parts))
		}
	}
	return out
}
