package nvshmem

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
)

func TestKernelGeometry(t *testing.T) {
	for _, tc := range []struct {
		p            int
		staging      int64
		nsend        int
		cap          int64
		errSubstring string
	}{
		{p: 2, staging: 16 << 20, nsend: 4, cap: 4 << 20},
		{p: 3, staging: 16 << 20, nsend: 4, cap: (16 << 20) / 6 / 256 * 256},
		{p: 4, staging: 16 << 20, nsend: 2, cap: 2 << 20},
		{p: 8, staging: 16 << 20, nsend: 1, cap: 1 << 20},
		{p: 64, staging: 16 << 20, nsend: 1, cap: 128 << 10},
		{p: 2, staging: 1000, errSubstring: "too small"},
		{p: 1, staging: 16 << 20, errSubstring: "2 to 64"},
		{p: 65, staging: 16 << 20, errSubstring: "2 to 64"},
	} {
		g, err := kernelGeometry(tc.p, tc.staging)
		if tc.errSubstring != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errSubstring) {
				t.Errorf("kernelGeometry(%d, %d): %v, want an error with %q", tc.p, tc.staging, err, tc.errSubstring)
			}
			continue
		}
		if err != nil {
			t.Errorf("kernelGeometry(%d, %d): %v", tc.p, tc.staging, err)
			continue
		}
		if g.nsend != tc.nsend || g.cap != tc.cap || g.nrecv != maxRecv || g.depth != depth {
			t.Errorf("kernelGeometry(%d, %d) = %+v, want nsend %d cap %d", tc.p, tc.staging, g, tc.nsend, tc.cap)
		}
		if g.cap%256 != 0 || int64(tc.p*g.depth)*g.cap > tc.staging {
			t.Errorf("kernelGeometry(%d, %d) = %+v: slots do not fit the staging", tc.p, tc.staging, g)
		}
		// Grids stay small enough to be resident on one H100/H200 at one
		// 512-thread block per SM (132 SMs).
		if blocks := (tc.p-1)*g.nsend + g.nrecv; blocks > 132 {
			t.Errorf("kernelGeometry(%d): %d blocks", tc.p, blocks)
		}
	}
}

// slice mirrors the kernel's slice (atp_exchange.cu): block k's share of
// bytes split n ways, in multiples of 16 bytes.
func slice(bytes int64, k, n int) (lo, hi int64) {
	per := ((bytes+int64(n)-1)/int64(n) + 15) / 16 * 16
	lo = min(bytes, per*int64(k))
	return lo, min(bytes, lo+per)
}

func TestSliceCovers(t *testing.T) {
	for _, bytes := range []int64{0, 1, 15, 16, 17, 255, 256, 1000, 4 << 20, 4<<20 - 2} {
		for n := 1; n <= maxSend; n++ {
			var next int64
			for k := range n {
				lo, hi := slice(bytes, k, n)
				if lo != next || hi < lo || (lo%16 != 0 && lo != bytes) {
					t.Fatalf("slice(%d, %d, %d) = [%d, %d), want it to start at %d on a 16-byte boundary", bytes, k, n, lo, hi, next)
				}
				next = hi
			}
			if next != bytes {
				t.Fatalf("slices of %d bytes %d ways end at %d", bytes, n, next)
			}
		}
	}
}

// dtypes of the simulation: element size and how to read and write one.
type simType struct {
	name string
	size int
	get  func(b []byte) float64
	put  func(b []byte, v float64)
}

var simF32 = simType{"f32", 4,
	func(b []byte) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))) },
	func(b []byte, v float64) { binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v))) }}

var simF64 = simType{"f64", 8,
	func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) },
	func(b []byte, v float64) { binary.LittleEndian.PutUint64(b, math.Float64bits(v)) }}

// simulate runs the plans of one op on the host the way the kernels move
// bytes: every pair in rounds of g.cap bytes, each round split among the
// sender blocks and, on arrival, among the receiver blocks, through the
// receiver's staging. Sends read the sources as they were before the op
// (the kernels only read parts that no rank writes during it). In reduce
// mode each receiver reduces, per round, its own part and every sender's
// round in rank order.
func simulate(t *testing.T, g geometry, plans []xplan, srcs, dsts [][]byte, dt simType, op comm.ReduceOp) {
	t.Helper()
	p := len(plans)
	before := make([][]byte, p)
	for i := range srcs {
		before[i] = slices.Clone(srcs[i])
	}
	// staged[j][i][round] = bytes of sender i's round at receiver j.
	staged := make([][][][]byte, p)
	for j := range p {
		staged[j] = make([][][]byte, p)
	}
	for i := range p {
		for j := range p {
			n := plans[i].sendBytes[j]
			if n != plans[j].recvBytes[i] {
				t.Fatalf("pair %d→%d: sender plans %d bytes, receiver %d", i, j, n, plans[j].recvBytes[i])
			}
			if i == j && n != 0 {
				t.Fatalf("rank %d plans %d bytes to itself through the kernels", i, n)
			}
			for r := int64(0); r < g.rounds(n); r++ {
				chunk := min(g.cap, n-r*g.cap)
				round := make([]byte, chunk)
				for s := range g.nsend {
					lo, hi := slice(chunk, s, g.nsend)
					off := plans[i].sendOff[j] + r*g.cap
					copy(round[lo:hi], before[i][off+lo:off+hi])
				}
				staged[j][i] = append(staged[j][i], round)
			}
		}
	}
	for j, x := range plans {
		switch x.mode {
		case modeCopy:
			for i := range p {
				for r, round := range staged[j][i] {
					for k := range g.nrecv {
						lo, hi := slice(int64(len(round)), k, g.nrecv)
						off := x.recvOff[i] + int64(r)*g.cap
						copy(dsts[j][off+lo:off+hi], round[lo:hi])
					}
				}
			}
			if x.selfBytes > 0 {
				copy(dsts[j][x.selfDstOff:x.selfDstOff+x.selfBytes], before[j][x.selfSrcOff:x.selfSrcOff+x.selfBytes])
			}
		case modeReduce:
			for r := int64(0); r < g.rounds(x.selfBytes); r++ {
				chunk := min(g.cap, x.selfBytes-r*g.cap)
				for e := int64(0); e < chunk; e += int64(dt.size) {
					var acc float64
					for k := range p {
						var v float64
						if k == j {
							v = dt.get(before[j][x.selfSrcOff+r*g.cap+e:])
						} else {
							v = dt.get(staged[j][k][r][e:])
						}
						switch {
						case k == 0:
							acc = v
						case op == comm.Max:
							acc = max(acc, v)
						default:
							acc += v
						}
					}
					if op == comm.Avg {
						acc /= float64(p)
					}
					dt.put(dsts[j][x.selfDstOff+r*g.cap+e:], acc)
				}
			}
		}
	}
}

// values fills n elements of dt with small integers (exact in f32 sums).
func values(rng *rand.Rand, dt simType, n int) []byte {
	b := make([]byte, n*dt.size)
	for i := range n {
		dt.put(b[i*dt.size:], float64(rng.IntN(201)-100))
	}
	return b
}

func decode(dt simType, b []byte) []float64 {
	out := make([]float64, len(b)/dt.size)
	for i := range out {
		out[i] = dt.get(b[i*dt.size:])
	}
	return out
}

func reduceRef(parts [][]float64, op comm.ReduceOp) []float64 {
	out := slices.Clone(parts[0])
	for _, q := range parts[1:] {
		for i, v := range q {
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

func TestPlansSimulated(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for p := 2; p <= 5; p++ {
		// A small staging, so that the bigger cases take several rounds.
		g, err := kernelGeometry(p, int64(p*depth*512))
		if err != nil {
			t.Fatal(err)
		}
		for _, dt := range []simType{simF32, simF64} {
			for _, n := range []int{0, 1, 7, 300, 1029} { // elements per rank (all-gather, reduce-scatter)
				name := fmt.Sprintf("p=%d/%s/n=%d", p, dt.name, n)
				t.Run("all-gather/"+name, func(t *testing.T) { checkAllGather(t, rng, g, p, dt, n) })
				for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.Max} {
					t.Run(fmt.Sprintf("reduce-scatter(%v)/%s", op, name), func(t *testing.T) { checkReduceScatter(t, rng, g, p, dt, n, op) })
					t.Run(fmt.Sprintf("all-reduce(%v)/%s", op, name), func(t *testing.T) { checkAllReduce(t, rng, g, p, dt, n, op) })
				}
				t.Run("broadcast/"+name, func(t *testing.T) { checkBroadcast(t, rng, g, p, dt, n) })
				t.Run("all-to-all-v/"+name, func(t *testing.T) { checkAllToAll(t, rng, g, p, dt, n) })
			}
		}
	}
}

func checkAllGather(t *testing.T, rng *rand.Rand, g geometry, p int, dt simType, n int) {
	size := int64(n * dt.size)
	srcs, dsts, plans := make([][]byte, p), make([][]byte, p), make([]xplan, p)
	var want []byte
	for q := range p {
		srcs[q] = values(rng, dt, n)
		dsts[q] = make([]byte, int64(p)*size)
		plans[q] = allGatherPlan(p, q, size)
		want = append(want, srcs[q]...)
	}
	simulate(t, g, plans, srcs, dsts, dt, comm.Sum)
	for q := range p {
		if !bytes.Equal(dsts[q], want) {
			t.Fatalf("rank %d: all-gather gave %v, want %v", q, decode(dt, dsts[q]), decode(dt, want))
		}
	}
}

func checkReduceScatter(t *testing.T, rng *rand.Rand, g geometry, p int, dt simType, n int, op comm.ReduceOp) {
	part := int64(n * dt.size)
	srcs, dsts, plans := make([][]byte, p), make([][]byte, p), make([]xplan, p)
	for q := range p {
		srcs[q] = values(rng, dt, p*n)
		dsts[q] = make([]byte, part)
		plans[q] = reduceScatterPlan(p, q, part)
	}
	simulate(t, g, plans, srcs, dsts, dt, op)
	for q := range p {
		parts := make([][]float64, p)
		for k := range p {
			parts[k] = decode(dt, srcs[k][int64(q)*part:int64(q+1)*part])
		}
		if got, want := decode(dt, dsts[q]), reduceRef(parts, op); !allClose(got, want) {
			t.Fatalf("rank %d: reduce-scatter(%v) gave %v, want %v", q, op, got, want)
		}
	}
}

func checkAllReduce(t *testing.T, rng *rand.Rand, g geometry, p int, dt simType, n int, op comm.ReduceOp) {
	bufs, rs, ag := make([][]byte, p), make([]xplan, p), make([]xplan, p)
	parts := make([][]float64, p)
	for q := range p {
		bufs[q] = values(rng, dt, n)
		parts[q] = decode(dt, bufs[q])
		rs[q], ag[q] = allReducePlans(p, q, int64(n), dt.size)
	}
	simulate(t, g, rs, bufs, bufs, dt, op) // in place, like the kernels
	simulate(t, g, ag, bufs, bufs, dt, op)
	want := reduceRef(parts, op)
	for q := range p {
		if got := decode(dt, bufs[q]); !allClose(got, want) {
			t.Fatalf("rank %d: all-reduce(%v) gave %v, want %v", q, op, got, want)
		}
	}
}

func checkBroadcast(t *testing.T, rng *rand.Rand, g geometry, p int, dt simType, n int) {
	for root := range p {
		bufs, plans := make([][]byte, p), make([]xplan, p)
		for q := range p {
			bufs[q] = values(rng, dt, n)
			plans[q] = broadcastPlan(p, q, root, int64(n*dt.size))
		}
		want := slices.Clone(bufs[root])
		simulate(t, g, plans, bufs, bufs, dt, comm.Sum)
		for q := range p {
			if !bytes.Equal(bufs[q], want) {
				t.Fatalf("rank %d: broadcast from %d gave %v, want %v", q, root, decode(dt, bufs[q]), decode(dt, want))
			}
		}
	}
}

func checkAllToAll(t *testing.T, rng *rand.Rand, g geometry, p int, dt simType, n int) {
	row := 3                   // elements per row
	counts := make([][]int, p) // counts[i][j]: rows from i to j, some zero
	for i := range counts {
		counts[i] = make([]int, p)
		for j := range counts[i] {
			if rng.IntN(4) > 0 {
				counts[i][j] = rng.IntN(n/row + 2)
			}
		}
	}
	rowBytes := int64(row * dt.size)
	srcs, dsts, plans := make([][]byte, p), make([][]byte, p), make([]xplan, p)
	for i := range p {
		send, recv := make([]int, p), make([]int, p)
		for j := range p {
			send[j], recv[j] = counts[i][j], counts[j][i]
		}
		var sendRows, recvRows int
		for j := range p {
			sendRows += send[j]
			recvRows += recv[j]
		}
		srcs[i] = values(rng, dt, sendRows*row)
		dsts[i] = make([]byte, int64(recvRows)*rowBytes)
		var err error
		if plans[i], err = allToAllPlan(p, i, rowBytes, send, recv); err != nil {
			t.Fatal(err)
		}
	}
	simulate(t, g, plans, srcs, dsts, dt, comm.Sum)
	for j := range p {
		var want []byte
		for i := range p {
			off := 0
			for k := range j {
				off += counts[i][k]
			}
			want = append(want, srcs[i][int64(off)*rowBytes:int64(off+counts[i][j])*rowBytes]...)
		}
		if !bytes.Equal(dsts[j], want) {
			t.Fatalf("rank %d: all-to-all-v gave %v, want %v", j, decode(dt, dsts[j]), decode(dt, want))
		}
	}
}

func allClose(got, want []float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > 1e-5*(1+math.Abs(want[i])) {
			return false
		}
	}
	return true
}

func TestAllToAllPlanSelfMismatch(t *testing.T) {
	_, err := allToAllPlan(3, 1, 4, []int{1, 2, 0}, []int{0, 1, 2})
	if err == nil || !strings.Contains(err.Error(), "expected") {
		t.Fatalf("got %v, want an error saying what was expected", err)
	}
}

func TestSplitParts(t *testing.T) {
	for _, tc := range []struct {
		p, es int
		n     int64
	}{{2, 4, 1}, {3, 4, 10}, {4, 2, 1031}, {5, 8, 3}, {8, 4, 0}} {
		off, length := splitParts(tc.p, tc.n, tc.es)
		var next int64
		for k := range tc.p {
			if off[k] != next || off[k]%16 != 0 && length[k] > 0 {
				t.Errorf("splitParts(%d, %d, %d): part %d at %d (length %d), want it at %d, 16-byte aligned", tc.p, tc.n, tc.es, k, off[k], length[k], next)
			}
			next = off[k] + length[k]
		}
		if next != tc.n*int64(tc.es) {
			t.Errorf("splitParts(%d, %d, %d): parts end at %d, want %d", tc.p, tc.n, tc.es, next, tc.n*int64(tc.es))
		}
	}
}

func TestSplitGroups(t *testing.T) {
	// Parity with reversed keys, as commtest's splitCases does, on 5 ranks,
	// and rank 4 joining no group.
	var entries []splitEntry
	for r := range 5 {
		e := splitEntry{color: r % 2, key: -r}
		if r == 4 {
			e.color = comm.NoColor
		}
		entries = append(entries, e)
	}
	groups := splitGroups(entries, comm.NoColor)
	want := []splitGroup{{color: 0, ranks: []int{2, 0}}, {color: 1, ranks: []int{3, 1}}}
	if len(groups) != len(want) {
		t.Fatalf("groups %v, want %v", groups, want)
	}
	for i := range want {
		if groups[i].color != want[i].color || !slices.Equal(groups[i].ranks, want[i].ranks) {
			t.Fatalf("groups %v, want %v", groups, want)
		}
		if _, _, ok := groups[i].strided(); ok {
			t.Errorf("group %v: strided, but its order is decreasing", groups[i])
		}
	}
	// Equal keys keep the parent order.
	groups = splitGroups([]splitEntry{{color: 7, key: 0}, {color: 7, key: 0}, {color: 7, key: 0}}, comm.NoColor)
	if !slices.Equal(groups[0].ranks, []int{0, 1, 2}) {
		t.Errorf("equal keys: %v, want ranks in parent order", groups[0].ranks)
	}
}

func TestStrided(t *testing.T) {
	for _, tc := range []struct {
		ranks         []int
		start, stride int
		ok            bool
	}{
		{[]int{0, 1, 2, 3}, 0, 1, true},   // a TP group
		{[]int{1, 3, 5, 7}, 1, 2, true},   // a DP group
		{[]int{2}, 2, 1, true},            // one rank
		{[]int{3, 1}, 0, 0, false},        // reversed keys
		{[]int{0, 1, 3}, 0, 0, false},     // uneven
		{[]int{}, 0, 0, false},            // nobody
		{[]int{4, 8, 12, 16}, 4, 4, true}, // EDP
	} {
		start, stride, ok := splitGroup{ranks: tc.ranks}.strided()
		if ok != tc.ok || ok && (start != tc.start || stride != tc.stride) {
			t.Errorf("strided(%v) = %d, %d, %v; want %d, %d, %v", tc.ranks, start, stride, ok, tc.start, tc.stride, tc.ok)
		}
	}
}

func TestChooseSlot(t *testing.T) {
	entries := []splitEntry{{used: 0b0001}, {used: 0b0011}, {used: 0b0101}, {used: 0b1111}}
	for _, tc := range []struct {
		ranks []int
		slots int
		want  int
	}{
		{[]int{0, 1}, 16, 2}, // slots 0 and 1 are used on rank 1
		{[]int{0, 2}, 16, 1}, // rank 2 uses 0 and 2
		{[]int{1, 2}, 16, 3}, // 0, 1 and 2 are taken
		{[]int{0, 1, 2, 3}, 16, 4},
		{[]int{3}, 4, -1}, // all four in use
	} {
		got, err := chooseSlot(splitGroup{ranks: tc.ranks}, entries, tc.slots)
		if got != tc.want || (tc.want < 0) != (err != nil) {
			t.Errorf("chooseSlot(%v, %d slots) = %d, %v; want %d", tc.ranks, tc.slots, got, err, tc.want)
		}
	}
	// 64 slots, all used but the last.
	all := []splitEntry{{used: math.MaxUint64 >> 1}}
	if got, err := chooseSlot(splitGroup{ranks: []int{0}}, all, 64); got != 63 || err != nil {
		t.Errorf("chooseSlot with only slot 63 free = %d, %v", got, err)
	}
}

func TestSlotLayout(t *testing.T) {
	for _, size := range []int{1, 2, 3, 64} {
		l := newSlotLayout(size, 1000)
		if l.acks < l.flags+int64(size*maxSend*8) || l.bar < l.acks+int64(size*maxRecv*8) || l.header < l.bar+int64(size*8) {
			t.Errorf("size %d: arrays overlap: %+v", size, l)
		}
		if l.stage%256 != 0 || l.stage < l.header || l.bytes%256 != 0 || l.bytes < l.stage+1000 {
			t.Errorf("size %d: staging misplaced: %+v", size, l)
		}
	}
}

func TestStreamOf(t *testing.T) {
	if _, ok, err := streamOf(nil); ok || err != nil {
		t.Errorf("streamOf(nil) = %v, %v", ok, err)
	}
	if h, ok, err := streamOf(StreamHandle(0x1234)); h != 0x1234 || !ok || err != nil {
		t.Errorf("streamOf(StreamHandle) = %#x, %v, %v", h, ok, err)
	}
	if _, _, err := streamOf(42); err == nil || !strings.Contains(err.Error(), "Handle() uintptr") {
		t.Errorf("streamOf(42): %v, want an error saying what a stream must be", err)
	}
}
