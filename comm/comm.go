package comm

import (
	"errors"
	"fmt"
	"strings"

	"github.com/asynctp/asynctp/tensor"
)

// Stream is an opaque per-device execution queue. Every data op of a Comm is
// queued on a Stream and returns a Work to wait on.
//
// nil means "the caller's default": on the CPU that is synchronous execution
// (comm/local ignores the stream). A GPU transport takes the CUDA stream of
// the backend whose tensors it moves (a value it defines, e.g. a *cuda.Stream)
// and rejects streams it does not know. Code above the transports only passes
// streams through; it never looks inside one.
type Stream interface{}

// Work is the completion of one queued op.
//
// Wait(s) orders stream s after the op: a GPU Work makes s wait on an event
// recorded after the op and returns at once, with no host synchronisation; a
// CPU Work returns when the op has finished. Wait returns the op's error (a
// peer that did not arrive in time, an abort, a mismatch between ranks).
// Wait may be called more than once and returns the same result each time.
//
// Until Wait has been called for it, an op's buffers belong to the transport:
// the caller must neither read its destination nor write its source.
type Work interface {
	// Wait orders the op's result before the work queued on s after it
	// (on the host: returns once the op is done) and returns its error.
	Wait(s Stream) error
}

// Done is a Work that has already completed without error (what ops that
// move nothing, e.g. on a group of one rank, return).
var Done Work = doneWork{}

type doneWork struct{}

func (doneWork) Wait(Stream) error { return nil }

// ReduceOp is the reduction of AllReduce and ReduceScatter.
type ReduceOp uint8

const (
	Sum ReduceOp = iota // Σ over ranks
	Avg                 // Σ over ranks / Size
	Max                 // elementwise maximum over ranks
)

// String is "sum", "avg" or "max".
func (op ReduceOp) String() string {
	switch op {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Max:
		return "max"
	}
	return fmt.Sprintf("reduce-op(%d)", uint8(op))
}

// NoColor is the color of a rank that joins no group in Split: it gets a nil
// Comm and a nil error (MPI_UNDEFINED).
const NoColor = -1

// Comm is a group of ranks that run collectives together: the world, or a
// group carved from it by Split. Each rank holds its own Comm value.
//
// Every data op is collective: all ranks of the group call the same op, in
// the same order, with matching sizes. Ops are queued on the stream s and
// return a Work (see Work for the async contract). Shapes are row-major and
// "rows" are the first dimension. A Comm is used by one goroutine at a time;
// different Comms (a TP and a DP group of the same rank) may be used
// concurrently.
//
// Errors name the op, the group, the rank and what was expected and what was
// found; local checks (shapes, dtypes, counts) are those of the Check
// functions, so every transport reports them the same way.
type Comm interface {
	// Rank is this rank's index in the group, in [0, Size).
	Rank() int
	// Size is the number of ranks in the group.
	Size() int
	// Name describes the group in error messages: a label and the world
	// ranks of its members in rank order, e.g. "tp[2 3]".
	Name() string

	// AllGather: dst (Size·R, ...) receives every rank's src (R, ...)
	// concatenated along the first dim, in rank order. src may be the
	// rank's own part of dst (in place).
	AllGather(dst, src *tensor.Tensor, s Stream) (Work, error)
	// ReduceScatter: src (Size·R, ...) is split into Size parts of R rows;
	// dst (R, ...) on rank r receives the reduction over ranks of part r.
	ReduceScatter(dst, src *tensor.Tensor, op ReduceOp, s Stream) (Work, error)
	// AllReduce: buf receives, in place, the reduction of every rank's buf.
	// The result is the same on every rank.
	AllReduce(buf *tensor.Tensor, op ReduceOp, s Stream) (Work, error)
	// AllToAllV: src is split along dim 0 into Size parts of sendCounts[j]
	// rows (part j goes to rank j); dst is split into parts of recvCounts[i]
	// rows (part i comes from rank i). Counts are rows, may be uneven or
	// zero, and must agree between peers: sendCounts[j] on rank i equals
	// recvCounts[i] on rank j. dst must not overlap src.
	AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s Stream) (Work, error)
	// Broadcast copies buf of rank root into buf of every rank.
	Broadcast(buf *tensor.Tensor, root int, s Stream) (Work, error)
	// Barrier blocks until every rank of the group has called it.
	Barrier() error
	// Split is collective: ranks that pass the same color form a new group,
	// ordered by key, then by rank in this group (MPI_Comm_split). A rank
	// that passes NoColor gets (nil, nil).
	Split(color, key int) (Comm, error)
	// Close releases this rank's part of the group. Ops after Close fail.
	Close() error
}

// SymmetricMemory is an optional capability of a Comm, found with
// SymmetricOf (which looks through decorators): a transport whose ranks can
// address each other's memory (NVSHMEM; later NCCL symmetric windows)
// allocates tensors at the same offset of a symmetric heap on every rank,
// and hands out the peer pointers through which a rank's copies and
// stream memory operations reach another rank's copy. The overlap layer's
// GPU strategies build their staging buffers and signal words from it.
//
// AllocSymmetric and FreeSymmetric are collective over the whole world,
// whichever group they are called on (NVSHMEM allocates on every PE):
// every rank of the world makes the same calls, with the same shapes, in
// the same order — as ranks that build the same model do — and no op of
// the world may be in flight meanwhile. The tensor is zeroed.
type SymmetricMemory interface {
	// AllocSymmetric allocates a zeroed tensor at the same offset of every
	// rank's symmetric heap (a collective of the world, as above).
	AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error)
	// FreeSymmetric frees a tensor of AllocSymmetric (collective too).
	FreeSymmetric(t *tensor.Tensor) error
	// PeerPtr is the device address of element 0 of group rank r's copy of
	// t (a view of a tensor of AllocSymmetric), reachable from this rank
	// with ordinary loads, stores and copies; an error when r cannot be
	// reached so (another node: use the transport's own ops).
	PeerPtr(t *tensor.Tensor, r int) (uint64, error)
}

// LoadStore is an optional capability of a group with symmetric memory,
// found with Unreachable (which looks through decorators): which ranks of
// the group reach each other's symmetric memory by loads and stores (peer
// access inside a node: NVLink, PCIe, or one GPU shared; ranks on other
// hosts do not). Every rank of the group gives the same answers, so that
// every rank takes the same decision from them.
type LoadStore interface {
	// Reaches reports whether group rank a reaches group rank b's
	// symmetric memory by loads and stores.
	Reaches(a, b int) bool
}

// Reaches reports whether group rank a of c reaches group rank b's
// symmetric memory by loads and stores: the group's LoadStore, looked for
// through decorators; true where the transport says nothing (its symmetric
// memory is one node's, as Unreachable takes it).
func Reaches(c Comm, a, b int) bool {
	ls, ok := capability[LoadStore](c)
	return !ok || ls.Reaches(a, b)
}

// Unreachable returns, for a group with symmetric memory, the ranks of the
// group that are not reachable by loads and stores from this rank or that
// do not reach it, and whether every pair of the group reaches each other
// (all: a strategy built on peer pointers can run on the group). A group
// whose transport says nothing (no LoadStore) is taken as reachable: its
// symmetric memory is one node's.
func Unreachable(c Comm) (ranks []int, all bool) {
	ls, ok := capability[LoadStore](c)
	if !ok {
		return nil, true
	}
	me, n := c.Rank(), c.Size()
	all = true
	for a := range n {
		for b := range n {
			if a != b && !ls.Reaches(a, b) {
				all = false
			}
		}
		if a != me && (!ls.Reaches(me, a) || !ls.Reaches(a, me)) {
			ranks = append(ranks, a)
		}
	}
	return ranks, all
}

// Membered is an optional capability of a group: the world rank of each
// of its ranks (every transport of this module has it), found with
// MembersOf.
type Membered interface {
	// Members returns the world rank of each rank of the group, in group
	// rank order.
	Members() []int
}

// MembersOf returns the world rank of each rank of c, looking through
// Wrappers; false where the transport does not say.
func MembersOf(c Comm) ([]int, bool) {
	if m, ok := capability[Membered](c); ok {
		return m.Members(), true
	}
	return nil, false
}

// Wrapper is a Comm that decorates another (a debugging wrapper): the
// optional capabilities are looked up through it.
type Wrapper interface {
	// Unwrap returns the Comm it decorates.
	Unwrap() Comm
}

// SymmetricOf returns c's SymmetricMemory, looking through Wrappers.
func SymmetricOf(c Comm) (SymmetricMemory, bool) { return capability[SymmetricMemory](c) }

// capability returns the first of c and the Comms it decorates (through
// Wrappers) that has the optional capability T.
func capability[T any](c Comm) (T, bool) {
	for c != nil {
		if v, ok := c.(T); ok {
			return v, true
		}
		w, ok := c.(Wrapper)
		if !ok {
			break
		}
		c = w.Unwrap()
	}
	var zero T
	return zero, false
}

// Aborter is an optional capability: Abort poisons the whole world (every
// group carved from it) with err, so that every pending and later op of every
// rank fails promptly with an error that names this rank and wraps err,
// instead of waiting for its deadline (ncclCommAbort). A rank calls it when
// it fails on its own and will not reach its next collective.
type Aborter interface {
	// Abort poisons the world with err (see above).
	Abort(err error)
}

// NamedSplitter is an optional capability: Split that gives the new groups a
// label for their Name ("tp" makes "tp[2 3]"). Use the SplitNamed function,
// which falls back to Split.
type NamedSplitter interface {
	// SplitNamed is Split with label naming the new groups.
	SplitNamed(color, key int, label string) (Comm, error)
}

// SplitNamed splits c as Split does, labelling the new groups when c can.
func SplitNamed(c Comm, color, key int, label string) (Comm, error) {
	if ns, ok := c.(NamedSplitter); ok {
		return ns.SplitNamed(color, key, label)
	}
	return c.Split(color, key)
}

// Errors that transports wrap, so callers can tell the failures apart with
// errors.Is.
var (
	// ErrTimeout: a peer did not reach a collective before the deadline.
	ErrTimeout = errors.New("comm: deadline exceeded")
	// ErrAborted: a rank aborted the world (Aborter), or an earlier failure
	// poisoned it.
	ErrAborted = errors.New("comm: aborted")
	// ErrMismatch: ranks called different ops, or the same op with sizes,
	// dtypes, roots or counts that do not agree.
	ErrMismatch = errors.New("comm: ranks disagree")
	// ErrClosed: the Comm, or a peer's part of the group, was closed.
	ErrClosed = errors.New("comm: closed")
)

// GroupName formats a group's name from a label and the world ranks of its
// members in rank order: GroupName("tp", []int{2, 3}) = "tp[2 3]". Long
// groups are abbreviated.
func GroupName(label string, worldRanks []int) string {
	var b strings.Builder
	b.WriteString(label)
	b.WriteByte('[')
	for i, r := range worldRanks {
		if i == 8 && len(worldRanks) > 10 {
			fmt.Fprintf(&b, " ... %d (%d ranks)", worldRanks[len(worldRanks)-1], len(worldRanks))
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprint(&b, r)
	}
	b.WriteByte(']')
	return b.String()
}
