package nvshmem

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
)

// The limits of the exchange kernels (atp_nvshmem.h: ATP_NV_MAXP,
// ATP_NV_MAXS, ATP_NV_MAXR); Load checks them against the library.
const (
	maxGroup = 64 // ranks in a group that uses the exchange kernels
	maxSend  = 4  // sender blocks per peer
	maxRecv  = 4  // receiver blocks
	depth    = 2  // staging slots per pair: rounds in flight
)

// geometry is the shape of a group's exchange kernels. It depends only on
// the group size and the staging size, which every rank of the group knows,
// so that senders and receivers agree on how bytes are split into rounds and
// blocks.
type geometry struct {
	nsend int   // sender blocks per peer
	nrecv int   // receiver blocks
	depth int   // staging slots per pair
	cap   int64 // bytes per round and pair: a multiple of 256
}

// kernelGeometry is the geometry of a group of p ranks whose staging has
// staging bytes: each pair gets depth slots of cap bytes.
func kernelGeometry(p int, staging int64) (geometry, error) {
	if p < 2 || p > maxGroup {
		return geometry{}, fmt.Errorf("a group of %d ranks: the exchange kernels handle 2 to %d", p, maxGroup)
	}
	s := max(1, min(maxSend, 8/(p-1)))
	cap := staging / int64(p*depth) / 256 * 256
	if cap < 256 {
		return geometry{}, fmt.Errorf("staging of %d bytes is too small for a group of %d ranks (at least %d bytes)", staging, p, 256*p*depth)
	}
	return geometry{nsend: s, nrecv: maxRecv, depth: depth, cap: cap}, nil
}

// rounds is how many rounds move bytes through slots of cap bytes.
func (g geometry) rounds(bytes int64) int64 { return (bytes + g.cap - 1) / g.cap }

// Exchange modes (atp_nvshmem.h).
const (
	modeCopy   = 0
	modeReduce = 1
)

// xplan is what one rank's exchange kernel moves, in bytes. Pair (me → j)
// sends sendBytes[j] from src+sendOff[j]; pair (i → me) receives
// recvBytes[i], which in modeCopy land at dst+recvOff[i] and in modeReduce
// are reduced with this rank's own part (src+selfSrcOff, selfBytes) into
// dst+selfDstOff. In modeCopy selfBytes are also copied from src+selfSrcOff
// to dst+selfDstOff. Entries for this rank itself are zero.
type xplan struct {
	mode                              int
	sendOff, sendBytes                []int64
	recvOff, recvBytes                []int64
	selfSrcOff, selfDstOff, selfBytes int64
}

func newPlan(p, mode int) xplan {
	return xplan{mode: mode, sendOff: make([]int64, p), sendBytes: make([]int64, p),
		recvOff: make([]int64, p), recvBytes: make([]int64, p)}
}

// moves reports whether the plan moves anything on this rank.
func (x xplan) moves() bool {
	if x.selfBytes > 0 {
		return true
	}
	for i := range x.sendBytes {
		if x.sendBytes[i] > 0 || x.recvBytes[i] > 0 {
			return true
		}
	}
	return false
}

// allGatherPlan: every rank sends its bytes to every other; part i of dst
// (offset i·bytes) comes from rank i.
func allGatherPlan(p, me int, bytes int64) xplan {
	x := newPlan(p, modeCopy)
	for q := range p {
		if q == me {
			continue
		}
		x.sendBytes[q] = bytes
		x.recvOff[q], x.recvBytes[q] = int64(q)*bytes, bytes
	}
	x.selfDstOff, x.selfBytes = int64(me)*bytes, bytes
	return x
}

// reduceScatterPlan: src holds p parts of part bytes; part j goes to rank
// j, which reduces the p copies it gets (its own included) into dst.
func reduceScatterPlan(p, me int, part int64) xplan {
	x := newPlan(p, modeReduce)
	for q := range p {
		if q == me {
			continue
		}
		x.sendOff[q], x.sendBytes[q] = int64(q)*part, part
		x.recvBytes[q] = part
	}
	x.selfSrcOff, x.selfBytes = int64(me)*part, part
	return x
}

// splitParts splits n elements of es bytes into p parts whose boundaries
// fall on 16-byte multiples; part k is [off[k], off[k]+len[k]) in bytes.
// Trailing parts may be empty.
func splitParts(p int, n int64, es int) (off, length []int64) {
	per := (n + int64(p) - 1) / int64(p)
	if step := int64(16 / es); step > 1 {
		per = (per + step - 1) / step * step
	}
	off, length = make([]int64, p), make([]int64, p)
	for k := range p {
		lo, hi := min(n, int64(k)*per), min(n, int64(k+1)*per)
		off[k], length[k] = lo*int64(es), (hi-lo)*int64(es)
	}
	return off, length
}

// allReducePlans: an all-reduce of n elements in place is a reduce-scatter
// of p parts (rank k reduces part k in place) then an all-gather of the
// reduced parts.
func allReducePlans(p, me int, n int64, es int) (rs, ag xplan) {
	off, length := splitParts(p, n, es)
	rs, ag = newPlan(p, modeReduce), newPlan(p, modeCopy)
	for q := range p {
		if q == me {
			continue
		}
		rs.sendOff[q], rs.sendBytes[q] = off[q], length[q]
		rs.recvBytes[q] = length[me]
		ag.sendOff[q], ag.sendBytes[q] = off[me], length[me]
		ag.recvOff[q], ag.recvBytes[q] = off[q], length[q]
	}
	rs.selfSrcOff, rs.selfDstOff, rs.selfBytes = off[me], off[me], length[me]
	return rs, ag
}

// broadcastPlan: root sends its bytes to every other rank, in place.
func broadcastPlan(p, me, root int, bytes int64) xplan {
	x := newPlan(p, modeCopy)
	for q := range p {
		switch {
		case me == root && q != me:
			x.sendBytes[q] = bytes
		case me != root && q == root:
			x.recvBytes[q] = bytes
		}
	}
	return x
}

// allToAllPlan: rank me sends send[j] rows of rowBytes to rank j and
// receives recv[i] rows from rank i, each side's parts packed in rank order.
// Its own rows (send[me], which must equal recv[me]) are copied locally.
func allToAllPlan(p, me int, rowBytes int64, send, recv []int) (xplan, error) {
	if send[me] != recv[me] {
		return xplan{}, fmt.Errorf("sendCounts[%d] = %d, recvCounts[%d] = %d: expected the rows a rank sends itself to equal the rows it receives from itself", me, send[me], me, recv[me])
	}
	x := newPlan(p, modeCopy)
	var so, ro int64
	for q := range p {
		sb, rb := int64(send[q])*rowBytes, int64(recv[q])*rowBytes
		if q == me {
			x.selfSrcOff, x.selfDstOff, x.selfBytes = so, ro, sb
		} else {
			x.sendOff[q], x.sendBytes[q] = so, sb
			x.recvOff[q], x.recvBytes[q] = ro, rb
		}
		so += sb
		ro += rb
	}
	return x, nil
}

// ---- Split planning --------------------------------------------------------

// splitEntry is one rank's contribution to a Split, indexed by its rank in
// the parent: its color and key, and the staging slots it has in use.
type splitEntry struct {
	color, key int
	used       uint64
}

// splitGroup is one new group: its color and its members' parent ranks in
// group order (by key, then parent rank).
type splitGroup struct {
	color int
	ranks []int
}

// splitGroups makes the new groups of a Split from every rank's entry,
// ordered by color; ranks with colorNone join none.
func splitGroups(entries []splitEntry, colorNone int) []splitGroup {
	byColor := map[int][]int{}
	for q, e := range entries {
		if e.color != colorNone {
			byColor[e.color] = append(byColor[e.color], q)
		}
	}
	groups := make([]splitGroup, 0, len(byColor))
	for color, ranks := range byColor {
		slices.SortStableFunc(ranks, func(a, b int) int {
			return cmp.Or(cmp.Compare(entries[a].key, entries[b].key), cmp.Compare(a, b))
		})
		groups = append(groups, splitGroup{color: color, ranks: ranks})
	}
	slices.SortFunc(groups, func(a, b splitGroup) int { return cmp.Compare(a.color, b.color) })
	return groups
}

// strided reports whether the group's parent ranks, in group order, are
// start, start+stride, ... with stride ≥ 1: the groups that
// nvshmem_team_split_strided can make (a team orders its PEs by their rank
// in the parent, so a group in another order cannot be a team).
func (g splitGroup) strided() (start, stride int, ok bool) {
	if len(g.ranks) == 0 {
		return 0, 0, false
	}
	start, stride = g.ranks[0], 1
	if len(g.ranks) > 1 {
		stride = g.ranks[1] - g.ranks[0]
	}
	if stride < 1 {
		return 0, 0, false
	}
	for i, r := range g.ranks {
		if r != start+i*stride {
			return 0, 0, false
		}
	}
	return start, stride, true
}

// chooseSlot picks the staging slot of a new group: the lowest one that no
// member has in use, so that it is the same on every member (they all see
// the same entries) and differs from every slot a member already uses.
// Groups with no member in common may share a slot: nothing ever writes into
// a slot but the members of its group.
func chooseSlot(g splitGroup, entries []splitEntry, slots int) (int, error) {
	var used uint64
	for _, q := range g.ranks {
		used |= entries[q].used
	}
	free := ^used
	if slots < 64 {
		free &= 1<<slots - 1
	}
	if free == 0 {
		return -1, fmt.Errorf("every one of the %d staging slots is in use on some member (close groups, or raise WithMaxGroups)", slots)
	}
	return bits.TrailingZeros64(free), nil
}

// slotLayout is where a group's symmetric memory lies in its slot of the
// world's arena, for a world of size ranks: the signal words (flags, acks,
// barrier), then the staging area, 256-aligned.
type slotLayout struct {
	flags, acks, bar, stage int64 // offsets in the slot
	header                  int64 // bytes of the signal words (zeroed for a new group)
	bytes                   int64 // the whole slot
}

func newSlotLayout(size int, staging int64) slotLayout {
	var l slotLayout
	l.flags = 0
	l.acks = l.flags + int64(size*maxSend*8)
	l.bar = l.acks + int64(size*maxRecv*8)
	l.header = l.bar + int64(size*8)
	l.stage = (l.header + 255) / 256 * 256
	l.bytes = (l.stage + staging + 255) / 256 * 256
	return l
}
