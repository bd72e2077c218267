package nvshmem

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynctp/asynctp/comm"
)

// Defaults of the options.
const (
	// DefaultTimeout is the deadline of every op (and of New, when its
	// context has none) unless WithTimeout says otherwise.
	DefaultTimeout = 5 * time.Minute
	// DefaultStaging is the symmetric staging area of each group, in bytes.
	DefaultStaging = 16 << 20
	// DefaultMaxGroups is how many groups a rank may have open at once
	// (the world included): the staging slots of the arena.
	DefaultMaxGroups = 16
)

// Algorithm chooses how a group runs its collectives.
type Algorithm int

const (
	// Auto runs all-gather, reduce-scatter, all-reduce and broadcast as
	// NVSHMEM on-stream collectives on the group's team when it has one
	// (and bf16 reductions when NVSHMEM has them), and everything else on
	// the P2P exchange kernels. In limited MPG mode (several PEs on one
	// GPU without MPS) no group has a team: everything runs on the kernels.
	Auto Algorithm = iota
	// Collectives is Auto, but New fails where NVSHMEM's collectives are
	// unavailable (limited MPG mode).
	Collectives
	// Kernels runs every op on the P2P exchange kernels; no team is made.
	Kernels
)

func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case Collectives:
		return "collectives"
	case Kernels:
		return "kernels"
	}
	return fmt.Sprintf("algorithm(%d)", int(a))
}

// Option configures New.
type Option func(*options)

type options struct {
	timeout   time.Duration
	label     string
	key       string
	staging   int64
	maxGroups int
	algo      Algorithm
	logf      func(format string, args ...any)
	onFailure func(error)
	poll      time.Duration
}

func defaultOptions() options {
	return options{timeout: DefaultTimeout, label: "world", staging: DefaultStaging, maxGroups: DefaultMaxGroups,
		algo: Auto, logf: logf, poll: time.Millisecond}
}

// WithTimeout sets the deadline of every op: the exchange kernels give up a
// wait after d (naming the peer they waited for), and an op whose event has
// not completed d (plus a grace of d/10, at least a second) after it was
// queued fails the world. d ≤ 0 keeps DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithLabel sets the label of the world's Name (default "world": "world[0 1]").
func WithLabel(label string) Option { return func(o *options) { o.label = label } }

// WithKey sets the prefix of the store keys of this world. By default the
// k-th New on a store client uses "asynctp/nvshmem/<k>".
func WithKey(prefix string) Option { return func(o *options) { o.key = prefix } }

// WithStaging sets the symmetric staging area of each group in bytes
// (default DefaultStaging). Ops on tensors outside the symmetric heap pass
// through it in chunks; it must be the same on every rank.
func WithStaging(bytes int64) Option {
	return func(o *options) {
		if bytes > 0 {
			o.staging = bytes
		}
	}
}

// WithMaxGroups sets how many groups (the world included) a rank may have
// open at once, 1 to 64 (default DefaultMaxGroups): the arena holds one
// staging slot per group.
func WithMaxGroups(n int) Option { return func(o *options) { o.maxGroups = n } }

// WithAlgorithm chooses how groups run their collectives (default Auto).
func WithAlgorithm(a Algorithm) Option { return func(o *options) { o.algo = a } }

// WithLogf sets where rank 0's report line and failures go (default: the
// standard logger); nil silences them.
func WithLogf(f func(format string, args ...any)) Option { return func(o *options) { o.logf = f } }

// WithOnFailure sets a function called once when the world fails (an op
// past its deadline, a kernel that gave up, a blocked NVSHMEM call), with
// the error; instead of logging it. NVSHMEM cannot abort what is waiting
// for a peer that is gone: a process whose world failed should exit, e.g.
// WithOnFailure(func(err error) { log.Print(err); os.Exit(1) }).
func WithOnFailure(f func(error)) Option { return func(o *options) { o.onFailure = f } }

// Comm is one rank's handle on a group of an NVSHMEM world: the world made
// by New, or a group split from it. It implements comm.Comm,
// comm.NamedSplitter and comm.SymmetricMemory.
type Comm struct {
	w        *world
	rank     int
	size     int
	label    string
	name     string
	members  []int // world rank (= PE) of each group rank
	isWorld  bool
	slot     int // staging slot, -1 for a group of one
	team     int // NVSHMEM team, -1 when none
	p2p      bool
	geom     geometry
	stream   uint64 // the group's own stream
	inEv     uint64 // orders the group's stream after the caller's
	counters uint64 // device: the kernels' round counters and error word
	barGen   uint64 // barriers done (guarded by mu)
	seq      atomic.Uint64

	mu      sync.Mutex // guards pending and closed; held while an op is queued
	pending []*work
	closed  bool
}

var (
	_ comm.Comm            = (*Comm)(nil)
	_ comm.NamedSplitter   = (*Comm)(nil)
	_ comm.SymmetricMemory = (*Comm)(nil)
	_ comm.LoadStore       = (*Comm)(nil)
)

// The device counters of a group: round counters of the sender blocks, of
// the receiver blocks, then the error word.
const (
	sendRoundsOff = 0
	recvRoundsOff = maxGroup * maxSend * 8
	errWordOff    = recvRoundsOff + maxGroup*maxRecv*8
	countersBytes = errWordOff + 256
)

// newComm makes this rank's handle on a group: its stream and, for a group
// of several ranks, its device counters, with the signal words of its slot
// and its failure record zeroed (the caller makes sure that no member uses
// the group before every member has done so).
func newComm(w *world, label string, rank int, members []int, slot, team int, isWorld bool) (*Comm, error) {
	c := &Comm{w: w, rank: rank, size: len(members), label: label, members: members, slot: slot, team: team, isWorld: isWorld}
	c.name = comm.GroupName(label, members)
	if c.size > 1 {
		c.p2p = w.p2p(members)
		if c.p2p {
			g, err := kernelGeometry(c.size, w.opts.staging)
			if err != nil {
				c.p2p = false
			} else {
				c.geom = g
			}
		}
		if c.team < 0 && !c.p2p {
			return nil, fmt.Errorf("group %s: no way to run its collectives: its ranks do not all reach each other by P2P loads and stores (nvshmem_ptr), and it is not an NVSHMEM team (a team needs ranks evenly strided in the parent, in increasing order, and NVSHMEM collectives, unavailable in limited MPG mode or with WithAlgorithm(Kernels))", c.name)
		}
	}
	var err error
	if c.stream, err = cStreamCreate(w.dev); err != nil {
		return nil, err
	}
	if c.inEv, err = cEventCreate(w.dev); err != nil {
		c.release()
		return nil, err
	}
	if c.size > 1 {
		if c.counters, err = cDevAlloc(w.dev, countersBytes); err != nil {
			c.release()
			return nil, err
		}
		err = cMemsetAsync(w.dev, c.counters, 0, countersBytes, c.stream)
		if err == nil {
			err = cMemsetAsync(w.dev, c.slotBase(), 0, w.layout.header, c.stream)
		}
		if err == nil {
			err = cStreamSync(w.dev, c.stream)
		}
		if err != nil {
			c.release()
			return nil, err
		}
		cClearRecord(w.recs, slot)
	}
	w.mu.Lock()
	if slot >= 0 {
		w.used |= 1 << slot
	}
	w.comms[c] = struct{}{}
	w.mu.Unlock()
	return c, nil
}

// Rank is this rank's index in the group.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the group.
func (c *Comm) Size() int { return c.size }

// Name is the group's label and the world ranks of its members, e.g. "tp[2 3]".
func (c *Comm) Name() string { return c.name }

// Members returns the world rank (the NVSHMEM PE) of each rank of the group.
func (c *Comm) Members() []int { return slices.Clone(c.members) }

// Device is the CUDA ordinal of this rank's GPU.
func (c *Comm) Device() int { return c.w.dev }

// Stream is the group's own stream: where its ops run (after waiting for the
// stream they are given), and the stream of ops given a nil comm.Stream.
func (c *Comm) Stream() StreamHandle { return StreamHandle(c.stream) }

// Report describes what the world runs over (logged by rank 0 at New).
func (c *Comm) Report() Report { return c.w.report }

// Path says how this group runs its collectives: "nvshmem team" (all-gather,
// reduce-scatter, all-reduce and broadcast as NVSHMEM on-stream collectives,
// all-to-all-v on the P2P kernels), "p2p kernels", or "local" for a group
// of one.
func (c *Comm) Path() string {
	switch {
	case c.size == 1:
		return "local"
	case c.team >= 0 && c.p2p:
		return "nvshmem team + p2p kernels"
	case c.team >= 0:
		return "nvshmem team"
	}
	return "p2p kernels"
}

// slotBase is the symmetric address of the group's slot.
func (c *Comm) slotBase() uint64 { return c.w.arena + uint64(int64(c.slot)*c.w.layout.bytes) }

// staging is the symmetric address and size of the group's staging area.
func (c *Comm) staging() (uint64, int64) {
	return c.slotBase() + uint64(c.w.layout.stage), c.w.opts.staging
}

// usable returns the error of an op on a closed group or a failed world.
func (c *Comm) usable(op string) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return comm.Errorf(c, op, "%w", comm.ErrClosed)
	}
	if err := c.w.failure(); err != nil {
		return comm.Errorf(c, op, "the world failed earlier: %w", err)
	}
	return nil
}

// Close releases this rank's part of the group after its queued ops have
// completed (within the op timeout). A group made by Split also destroys its
// NVSHMEM team, which every member must do. Closing the world closes the
// groups still open and finalises NVSHMEM, which is collective over every
// PE and happens once per process. In a failed world Close releases what it
// can without waiting for the other ranks and returns the failure: NVSHMEM
// cannot be finalised then, and the process should exit.
func (c *Comm) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	w := c.w
	var errs []error
	if err := w.failure(); err != nil {
		errs = append(errs, comm.Errorf(c, "close", "the world failed earlier, NVSHMEM is not finalised: %w", err))
	} else if err := c.drain("close"); err != nil {
		errs = append(errs, err)
	}
	if c.isWorld {
		w.mu.Lock()
		var open []*Comm
		for o := range w.comms {
			if o != c {
				open = append(open, o)
			}
		}
		w.mu.Unlock()
		for _, o := range open {
			o.mu.Lock()
			o.closed = true
			o.mu.Unlock()
			o.release()
		}
	} else if c.team >= 0 && w.failure() == nil {
		deadline := time.Now().Add(w.opts.timeout)
		if err := w.blocking("nvshmem_team_destroy of "+c.name, deadline, func() error { return cTeamDestroy(c.team) }); err != nil {
			errs = append(errs, comm.Errorf(c, "close", "%w", err))
		}
	}
	c.release()
	if c.isWorld {
		close(w.stop)
		<-w.stopped
		hung := false
		if w.failure() == nil {
			deadline := time.Now().Add(w.opts.timeout)
			if err := w.blocking("nvshmem_finalize", deadline, cFinalize); err != nil {
				errs = append(errs, comm.Errorf(c, "close", "%w", err))
				hung = true
			}
		}
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		// A finalize still running (a peer never came) keeps the device
		// busy, and freeing pinned memory would wait for it: leak the
		// records instead, so that Close returns and the process can exit.
		if !hung {
			cHostFree(w.dev, w.recs)
		}
	}
	return errors.Join(errs...)
}

// drain waits until the group's queued ops have completed, within the op
// timeout; past it the world fails.
func (c *Comm) drain(op string) error {
	ev, err := c.w.event()
	if err == nil {
		err = cEventRecord(c.w.dev, ev, c.stream)
	}
	if err != nil {
		return comm.Errorf(c, op, "%w", err)
	}
	deadline := time.Now().Add(c.w.opts.timeout + grace(c.w.opts.timeout))
	for d := 10 * time.Microsecond; ; d = min(2*d, time.Millisecond) {
		done, err := cEventQuery(c.w.dev, ev)
		if err != nil {
			return comm.Errorf(c, op, "waiting for the queued ops: %w", err)
		}
		if done {
			c.w.recycle(ev)
			return nil
		}
		if err := c.w.failure(); err != nil {
			return comm.Errorf(c, op, "the world failed: %w", err)
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("%s on %s, world rank %d: the queued ops did not complete within %v: %w", op, c.name, c.w.rank, c.w.opts.timeout, comm.ErrTimeout)
			c.w.fail(err)
			return comm.Errorf(c, op, "%w", err)
		}
		time.Sleep(d)
	}
}

// release frees this rank's resources of the group, without waiting for
// anything (the caller has drained it, or the world failed).
func (c *Comm) release() {
	w := c.w
	failed := w.failed.Load()
	if c.counters != 0 && !failed {
		cDevFree(w.dev, c.counters) // while a failed kernel may still run, the memory leaks
	}
	c.counters = 0
	if c.inEv != 0 {
		cEventDestroy(w.dev, c.inEv)
		c.inEv = 0
	}
	if c.stream != 0 {
		cStreamDestroy(w.dev, c.stream)
		c.stream = 0
	}
	w.mu.Lock()
	if _, ok := w.comms[c]; ok {
		delete(w.comms, c)
		if c.slot >= 0 && !failed {
			w.used &^= 1 << c.slot // a failed world's slots may still receive late signals
		}
	}
	w.mu.Unlock()
}

// grace is how long after an op's own timeout the host gives up on it: the
// kernels' waits time out first and name the peer.
func grace(timeout time.Duration) time.Duration { return max(time.Second, timeout/10) }
