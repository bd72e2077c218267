package local

import (
	"cmp"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/hostops"
	"github.com/asynctp/asynctp/tensor"
)

// DefaultTimeout is how long a blocking call waits for the other ranks
// unless WithTimeout says otherwise.
const DefaultTimeout = 60 * time.Second

// Option configures a world.
type Option func(*config)

type config struct {
	timeout time.Duration
	async   bool
}

// WithTimeout sets the deadline of every blocking call: a rank that waits
// longer than d for its peers fails with an error naming the ranks that did
// not arrive, and poisons the world so that every other rank fails too.
// d ≤ 0 keeps DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// Async makes data ops return as soon as this rank has arrived, before the
// op has run; Work.Wait then blocks until it completes. Tests use it to
// prove that callers honour the async contract (the race detector sees a
// caller that reads dst before Wait). Without it, data ops return when the
// op is done and their Work is already complete.
func Async() Option { return func(c *config) { c.async = true } }

// world is what every group of one NewWorld shares: the options and the
// abort state.
type world struct {
	cfg      config
	once     sync.Once
	aborted  chan struct{} // closed by abort
	abortErr error         // set before aborted is closed
}

func (w *world) abort(err error) {
	w.once.Do(func() {
		w.abortErr = err
		close(w.aborted)
	})
}

// err returns the abort error, or nil while the world is healthy.
func (w *world) err() error {
	select {
	case <-w.aborted:
		return w.abortErr
	default:
		return nil
	}
}

// group is the shared state of one group: its members and the slots of the
// calls in flight, keyed by sequence number.
type group struct {
	w       *world
	label   string
	name    string
	members []int // world rank of each group rank

	mu     sync.Mutex
	slots  map[uint64]*slot
	closed []bool // by group rank
}

func newGroup(w *world, label string, members []int) *group {
	return &group{
		w: w, label: label, name: comm.GroupName(label, members), members: members,
		slots: map[uint64]*slot{}, closed: make([]bool, len(members)),
	}
}

// Comm is one rank's handle on a group of a local world. It implements
// comm.Comm, comm.Aborter and comm.NamedSplitter.
type Comm struct {
	g    *group
	rank int
	seq  uint64 // sequence number of this rank's next call; guarded by g.mu
}

var (
	_ comm.Comm          = (*Comm)(nil)
	_ comm.Aborter       = (*Comm)(nil)
	_ comm.NamedSplitter = (*Comm)(nil)
)

// NewWorld returns the n ranks of a new world, rank r at index r. Each is
// meant to be driven by its own goroutine. n < 1 is a programming error and
// panics.
func NewWorld(n int, opts ...Option) []comm.Comm {
	if n < 1 {
		panic(fmt.Sprintf("local: NewWorld(%d): expected at least one rank", n))
	}
	cfg := config{timeout: DefaultTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	w := &world{cfg: cfg, aborted: make(chan struct{})}
	members := make([]int, n)
	for i := range members {
		members[i] = i
	}
	g := newGroup(w, "world", members)
	out := make([]comm.Comm, n)
	for r := range out {
		out[r] = &Comm{g: g, rank: r}
	}
	return out
}

// Run runs fn on each rank of a new world, one goroutine per rank, and
// returns the errors of the ranks, joined. A rank whose fn fails or panics
// aborts the world, so the others fail promptly instead of waiting for their
// deadline. The comms are closed when every fn has returned.
func Run(n int, fn func(c comm.Comm) error, opts ...Option) error {
	ranks := NewWorld(n, opts...)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range ranks {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[r] = fmt.Errorf("local: rank %d panicked: %v\n%s", r, p, debug.Stack())
					c.(*Comm).Abort(errs[r])
				}
			}()
			if err := fn(c); err != nil {
				errs[r] = fmt.Errorf("local: rank %d: %w", r, err)
				c.(*Comm).Abort(err)
			}
		})
	}
	wg.Wait()
	for _, c := range ranks {
		c.Close()
	}
	// Root causes first: the errors of ranks that were only woken by an
	// abort come last.
	slices.SortStableFunc(errs, func(a, b error) int {
		return cmp.Compare(btoi(errors.Is(a, comm.ErrAborted)), btoi(errors.Is(b, comm.ErrAborted)))
	})
	return errors.Join(errs...)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Rank is this rank's index in the group.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks of the group.
func (c *Comm) Size() int { return len(c.g.members) }

// Name is the group's name ("world", or the label of a Split).
func (c *Comm) Name() string { return c.g.name }

// Members returns the world rank of each rank of the group.
func (c *Comm) Members() []int { return append([]int(nil), c.g.members...) }

// Abort poisons the world: every pending and later call of every rank, in
// every group, fails with an error that names this rank and wraps err and
// comm.ErrAborted.
func (c *Comm) Abort(err error) {
	c.g.w.abort(fmt.Errorf("world rank %d aborted: %w (%w)", c.g.members[c.rank], err, comm.ErrAborted))
}

// Close closes this rank's handle. Peers that wait for it in a call, or call
// later, fail with comm.ErrClosed instead of waiting for their deadline.
// Groups split from c are not closed.
func (c *Comm) Close() error {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed[c.rank] {
		return nil
	}
	g.closed[c.rank] = true
	for _, s := range g.slots {
		if s.state == waiting && s.calls[c.rank] == nil {
			s.finish(g.closedErr(s, c.rank))
		}
	}
	return nil
}

// AllGather is comm.Comm's: dst (P·n, ...) receives every rank's src (n,
// ...) in rank order. The stream is ignored; with Async the op may still
// run after the call returns, until the Work's Wait.
func (c *Comm) AllGather(dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	cl := &call{op: comm.OpAllGather, dst: dst, src: src}
	cl.err = hostops.FirstErr(comm.CheckAllGather(c, dst, src), c.hostOnly(cl.op, dst, src))
	if cl.err == nil {
		cl.sig = fmt.Sprintf("all-gather of %v", hostops.ShapeOf(src))
	}
	return c.data(cl)
}

// ReduceScatter is comm.Comm's: dst (n, ...) receives this rank's part of
// the reduction (op) of every rank's src (P·n, ...), accumulated in
// float64 from rank 0 on (deterministic).
func (c *Comm) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	cl := &call{op: comm.OpReduceScatter, dst: dst, src: src, rop: op}
	cl.err = hostops.FirstErr(comm.CheckReduceScatter(c, dst, src, op), c.hostOnly(cl.op, dst, src))
	if cl.err == nil {
		cl.sig = fmt.Sprintf("reduce-scatter(%v) of %v", op, hostops.ShapeOf(src))
	}
	return c.data(cl)
}

// AllReduce is comm.Comm's: buf becomes, on every rank, the reduction
// (op) of every rank's buf, accumulated in float64 from rank 0 on: the
// same bits on every rank.
func (c *Comm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	cl := &call{op: comm.OpAllReduce, dst: buf, src: buf, rop: op}
	cl.err = hostops.FirstErr(comm.CheckAllReduce(c, buf, op), c.hostOnly(cl.op, buf))
	if cl.err == nil {
		cl.sig = fmt.Sprintf("all-reduce(%v) of %v", op, hostops.ShapeOf(buf))
	}
	return c.data(cl)
}

// AllToAllV is comm.Comm's: rank r sends sendCounts[q] rows of src to each
// rank q, in order, and receives recvCounts[q] rows from each into dst.
func (c *Comm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	cl := &call{op: comm.OpAllToAllV, dst: dst, src: src,
		send: append([]int(nil), sendCounts...), recv: append([]int(nil), recvCounts...)}
	cl.err = hostops.FirstErr(comm.CheckAllToAllV(c, dst, src, sendCounts, recvCounts), c.hostOnly(cl.op, dst, src))
	if cl.err == nil {
		cl.sig = fmt.Sprintf("all-to-all-v of %v rows %v", src.DType(), append(tensor.Shape{-1}, src.Shape()[1:]...))
	}
	return c.data(cl)
}

// Broadcast is comm.Comm's: buf becomes root's buf on every rank.
func (c *Comm) Broadcast(buf *tensor.Tensor, root int, s comm.Stream) (comm.Work, error) {
	cl := &call{op: comm.OpBroadcast, dst: buf, src: buf, root: root}
	cl.err = hostops.FirstErr(comm.CheckBroadcast(c, buf, root), c.hostOnly(cl.op, buf))
	if cl.err == nil {
		cl.sig = fmt.Sprintf("broadcast from rank %d of %v", root, hostops.ShapeOf(buf))
	}
	return c.data(cl)
}

// Barrier returns once every rank of the group has called it (or with the
// group's error: a deadline, an abort, a closed peer).
func (c *Comm) Barrier() error {
	wk, err := c.start(&call{op: comm.OpBarrier, sig: "barrier"})
	if err != nil {
		return err
	}
	return wk.Wait(nil)
}

// Split implements comm.Comm; the new groups are labelled by this group's
// label and the color ("world/1[1 3]").
func (c *Comm) Split(color, key int) (comm.Comm, error) {
	return c.SplitNamed(color, key, "")
}

// SplitNamed is Split with a label for the new groups ("tp" makes "tp[2 3]").
func (c *Comm) SplitNamed(color, key int, label string) (comm.Comm, error) {
	cl := &call{op: comm.OpSplit, color: color, key: key, label: label, sig: fmt.Sprintf("split %q", label)}
	if color < 0 && color != comm.NoColor {
		cl.err = comm.Errorf(c, cl.op, "color %d: expected ≥ 0 or comm.NoColor (%d)", color, comm.NoColor)
	}
	wk, err := c.start(cl)
	if err == nil {
		err = wk.Wait(nil)
	}
	if err != nil || cl.out == nil {
		return nil, err // a nil interface, not a nil *Comm, for NoColor
	}
	return cl.out, nil
}

// data starts a data op and, unless the world is Async, waits for it.
func (c *Comm) data(cl *call) (comm.Work, error) {
	wk, err := c.start(cl)
	if err != nil {
		return nil, err
	}
	if !c.g.w.cfg.async {
		if err := wk.Wait(nil); err != nil {
			return nil, err
		}
	}
	return wk, nil
}

// hostOnly checks that every tensor is in host memory.
func (c *Comm) hostOnly(op string, ts ...*tensor.Tensor) error {
	return hostops.HostOnly(c, op, "comm/local", ts...)
}
