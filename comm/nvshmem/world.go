package nvshmem

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/worldsetup"
	"github.com/asynctp/asynctp/comm/rendezvous"
)

// NVSHMEM's init states (nvshmemx_init_status).
const (
	statusInitialized = 2 // one PE per GPU
	statusLimitedMPG  = 3 // several PEs share a GPU, without MPS
	statusFullMPG     = 4 // several PEs share a GPU, with MPS
)

// world is this process's PE of the NVSHMEM world and what its groups share:
// the library, the device, the arena of staging slots on the symmetric
// heap, the failure state, the event pool and the watchdog.
type world struct {
	lib    Library
	dev    int
	rank   int
	size   int
	opts   options
	status int
	prefix string
	layout slotLayout // of every slot
	arena  uint64     // symmetric: opts.maxGroups slots
	recs   uint64     // mapped host memory: one atp_nv_errrec per slot (host address)
	recsD  uint64     // the same, device address
	peers  []peerInfo // every rank's, by world rank
	report Report

	splitMu sync.Mutex // one Split, AllocSymmetric or FreeSymmetric at a time

	mu     sync.Mutex
	used   uint64 // staging slots in use by this rank's groups
	comms  map[*Comm]struct{}
	err    error // why the world failed, once it has
	closed bool

	evMu   sync.Mutex
	events []uint64 // completed events, for reuse

	failed   atomic.Bool
	failOnce sync.Once
	kick     chan struct{} // wakes the watchdog when an op is queued
	stop     chan struct{}
	stopped  chan struct{}
}

// peerInfo is what each rank tells the others at New, through the store.
type peerInfo struct {
	Host      string `json:"host"`
	PCI       string `json:"pci"`
	Name      string `json:"name"`
	P2P       []bool `json:"p2p"` // nvshmem_ptr gave an address for each world rank
	Status    int    `json:"status"`
	Staging   int64  `json:"staging"`
	MaxGroups int    `json:"max_groups"`
	Algorithm string `json:"algorithm"`
}

// New makes this process's PE of an NVSHMEM world of size PEs, PE rank, on
// CUDA device ordinal device; several PEs may share a device. It is
// collective: every rank calls it with the same size and options.
//
// The UID bootstrap needs no launcher: rank 0 asks NVSHMEM for a unique id,
// the rendezvous store carries it to the others (BroadcastBytes), and every
// rank initialises NVSHMEM with it. Then every rank allocates the staging
// arena on the symmetric heap (WithStaging, WithMaxGroups), finds which
// peers it reaches by loads and stores (P2P), and tells the others through
// the store; rank 0 logs one line saying what the world runs over (Report).
//
// Before initialising NVSHMEM, New sets NVSHMEM_DISABLE_NCCL=1 unless the
// variable is set, so that NVSHMEM's collectives stay NVSHMEM's (NCCL also
// refuses several ranks on one GPU). NVSHMEM can be initialised once per
// process: Close of the world finalises it for good.
func New(ctx context.Context, store *rendezvous.Client, rank, size, device int, opts ...Option) (*Comm, error) {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	if err := worldsetup.CheckGPU("nvshmem", rank, size, device, store); err != nil {
		return nil, err
	}
	if o.maxGroups < 1 || o.maxGroups > 64 {
		return nil, fmt.Errorf("nvshmem: WithMaxGroups(%d): expected 1 to 64", o.maxGroups)
	}
	lib, err := Load()
	if err != nil {
		return nil, err
	}
	where := fmt.Sprintf("nvshmem: world rank %d of %d on cuda:%d", rank, size, device)
	if n, err := cDeviceCount(); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	} else if device >= n {
		return nil, fmt.Errorf("%s: this machine has %d CUDA devices", where, n)
	}
	start := time.Now()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = start.Add(o.timeout)
	}
	w := &world{lib: lib, dev: device, rank: rank, size: size, opts: o, comms: map[*Comm]struct{}{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	w.layout = newSlotLayout(size, o.staging)
	w.prefix = o.key
	if w.prefix == "" && store != nil {
		w.prefix = worldsetup.Prefix(store, "nvshmem")
	}

	// The unique id, from rank 0 to all.
	var uid []byte
	if rank == 0 {
		if uid, err = cUniqueID(device, lib.uidBytes); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	if size > 1 {
		if uid, err = store.BroadcastBytes(ctx, w.prefix+"/uid", rank, 0, uid); err != nil {
			return nil, fmt.Errorf("%s: sharing the unique id: %w", where, err)
		}
	}
	if len(uid) != lib.uidBytes {
		return nil, fmt.Errorf("%s: the unique id from rank 0 has %d bytes, expected %d", where, len(uid), lib.uidBytes)
	}
	if os.Getenv("NVSHMEM_DISABLE_NCCL") == "" {
		os.Setenv("NVSHMEM_DISABLE_NCCL", "1")
	}
	var status int
	err = w.blocking("nvshmemx_init_attr (UID bootstrap)", deadline, func() error {
		s, err := cInit(device, rank, size, uid)
		status = s
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	w.status = status
	if o.algo == Collectives && w.status == statusLimitedMPG {
		return nil, fmt.Errorf("%s: WithAlgorithm(Collectives): NVSHMEM runs in limited MPG mode (several PEs share a GPU without MPS), where its collectives exit the process; use Auto or Kernels, or start MPS", where)
	}
	arenaBytes := int64(o.maxGroups) * w.layout.bytes
	var arena uint64
	err = w.blocking(fmt.Sprintf("nvshmem_calloc(%d bytes of staging)", arenaBytes), deadline, func() error {
		a, err := cCalloc(arenaBytes)
		arena = a
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	w.arena = arena
	if w.recs, w.recsD, err = cHostAlloc(device, int64(o.maxGroups)*recordBytes); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}

	me := peerInfo{Status: w.status, Staging: o.staging, MaxGroups: o.maxGroups, Algorithm: o.algo.String(), P2P: make([]bool, size)}
	me.Host, _ = os.Hostname()
	if me.Name, me.PCI, err = cDeviceInfo(device); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	for q := range size {
		me.P2P[q] = q == rank || cPtr(w.arena, q) != 0
	}
	if w.peers, err = exchangeInfo(ctx, store, w.prefix, rank, size, me); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	for q, p := range w.peers {
		if p.Staging != o.staging || p.MaxGroups != o.maxGroups || p.Algorithm != me.Algorithm {
			return nil, fmt.Errorf("%s: rank %d has staging %d, %d groups, algorithm %s; this rank %d, %d, %s: expected the same options on every rank (%w)",
				where, q, p.Staging, p.MaxGroups, p.Algorithm, o.staging, o.maxGroups, me.Algorithm, comm.ErrMismatch)
		}
	}
	w.report = w.makeReport()

	team := -1
	if w.teamsAllowed() {
		team = cTeamWorld()
	}
	c, err := newComm(w, o.label, rank, seqRanks(size), 0, team, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if size > 1 {
		if err := store.Barrier(ctx, w.prefix+"/ready", size); err != nil {
			c.release()
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	if rank == 0 && o.logf != nil {
		o.logf("%v", w.report)
	}
	go w.watch()
	return c, nil
}

func seqRanks(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

// exchangeInfo tells every rank what this one found, and returns every
// rank's, by rank.
func exchangeInfo(ctx context.Context, store *rendezvous.Client, prefix string, rank, size int, me peerInfo) ([]peerInfo, error) {
	all := make([]peerInfo, size)
	all[rank] = me
	if size == 1 {
		return all, nil
	}
	b, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	if err := store.Set(ctx, fmt.Sprintf("%s/info/%d", prefix, rank), b); err != nil {
		return nil, fmt.Errorf("telling the others what this rank found: %w", err)
	}
	for q := range size {
		if q == rank {
			continue
		}
		v, err := store.Get(ctx, fmt.Sprintf("%s/info/%d", prefix, q))
		if err != nil {
			return nil, fmt.Errorf("reading what rank %d found: %w", q, err)
		}
		if err := json.Unmarshal(v, &all[q]); err != nil || len(all[q].P2P) != size {
			return nil, fmt.Errorf("rank %d's description %q: expected JSON with %d P2P entries (%v)", q, v, size, err)
		}
	}
	return all, nil
}

// teamsAllowed reports whether groups may use NVSHMEM teams and their
// collectives: not in limited MPG mode (where NVSHMEM's collectives exit the
// process) and not with WithAlgorithm(Kernels).
func (w *world) teamsAllowed() bool {
	return w.status != statusLimitedMPG && w.opts.algo != Kernels
}

// p2p reports whether every pair of the given world ranks reaches each
// other by loads and stores.
func (w *world) p2p(members []int) bool {
	for _, a := range members {
		for _, b := range members {
			if !w.peers[a].P2P[b] {
				return false
			}
		}
	}
	return true
}

// blocking runs a host call that waits for other PEs (NVSHMEM's init, its
// collective allocations, team creation) and gives up at deadline. NVSHMEM
// cannot abort such a call: after a timeout it stays blocked on its thread,
// the world fails, and the process should exit.
func (w *world) blocking(what string, deadline time.Time, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		err := fmt.Errorf("%s did not return by its deadline (is a rank missing?); NVSHMEM cannot abort it, so this process should exit: %w", what, comm.ErrTimeout)
		w.fail(err)
		return err
	}
}

// fail fails the world with err (the first failure wins): every pending op
// of every group fails with it, and so does every later op. It logs the
// failure once, with what to do.
func (w *world) fail(err error) {
	w.failOnce.Do(func() {
		w.mu.Lock()
		w.err = err
		comms := make([]*Comm, 0, len(w.comms))
		for c := range w.comms {
			comms = append(comms, c)
		}
		w.mu.Unlock()
		w.failed.Store(true)
		for _, c := range comms {
			c.failPending(err)
		}
		if w.opts.onFailure != nil {
			w.opts.onFailure(err)
		} else if w.opts.logf != nil {
			w.opts.logf("nvshmem: world rank %d: the world failed: %v. NVSHMEM cannot abort what its kernels and calls are waiting for: exit this process (Close returns at once and skips nvshmem_finalize)", w.rank, err)
		}
	})
}

// failure returns why the world failed, or nil.
func (w *world) failure() error {
	if !w.failed.Load() {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// ---- events ------------------------------------------------------------------

func (w *world) event() (uint64, error) {
	w.evMu.Lock()
	if n := len(w.events); n > 0 {
		e := w.events[n-1]
		w.events = w.events[:n-1]
		w.evMu.Unlock()
		return e, nil
	}
	w.evMu.Unlock()
	return cEventCreate(w.dev)
}

// recycle takes back the event of a completed op.
func (w *world) recycle(e uint64) {
	w.evMu.Lock()
	defer w.evMu.Unlock()
	w.events = append(w.events, e)
}

// ---- the watchdog ----------------------------------------------------------------

// watch polls the events of the queued ops of every group and the failure
// records of their kernels, finishing the ops that completed and failing the
// world at the first op past its deadline or kernel that gave up.
func (w *world) watch() {
	defer close(w.stopped)
	t := time.NewTimer(w.opts.poll)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.kick:
		case <-t.C:
		}
		busy := false
		w.mu.Lock()
		comms := make([]*Comm, 0, len(w.comms))
		for c := range w.comms {
			comms = append(comms, c)
		}
		w.mu.Unlock()
		now := time.Now()
		for _, c := range comms {
			if c.poll(now) {
				busy = true
			}
		}
		d := w.opts.poll
		if !busy {
			d = 10 * w.opts.poll
		}
		t.Reset(d)
	}
}

func (w *world) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// logf is the default logger of the report line: the standard logger.
func logf(format string, args ...any) { log.Printf(format, args...) }
