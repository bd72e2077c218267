package tcp

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/hostops"
	"github.com/asynctp/asynctp/tensor"
)

// Every op is one exchange: each rank sends every other member of the
// group a data frame with its header and the payload meant for it (if
// any), then receives every other member's. The headers are compared, so
// that ranks that called different ops, or the same op with other sizes,
// fail with comm.ErrMismatch instead of corrupting each other; a rank whose
// call failed its local checks still takes part, so its peers fail at once
// too. The op then runs locally on the received payloads. Reductions
// accumulate in float64 in rank order (rank 0 first) and round once, like
// comm/local, so every rank gets bit-identical results.

// exchange runs the exchange of one op. local is this rank's local check
// failure (nil when the call is fine); payload(q) is what goes to group
// rank q (nil: nothing). It returns the headers and payloads of every rank
// by group rank (this rank's: its header, no payload) and the op's
// sequence number.
func (c *Comm) exchange(op string, h header, local error, payload func(q int) []byte) ([]*message, uint64, error) {
	if err := c.usable(op); err != nil {
		return nil, 0, err
	}
	if local != nil {
		h = header{failed: true, sig: local.Error()}
	}
	g, w := c.g, c.g.w
	seq := c.seq.Add(1) - 1
	start := time.Now()
	deadline := start.Add(w.opts.timeout)
	msgs := make([]*message, len(g.members))
	msgs[c.rank] = &message{h: h}
	if len(g.members) > 1 {
		head := newFrame(kindData).str(g.id).u64(seq).header(h)
		for q, to := range g.members {
			if q == c.rank {
				continue
			}
			var p []byte
			if payload != nil && local == nil {
				p = payload(q)
			}
			if len(head)-4+len(p) > maxFrame {
				return nil, seq, c.wrap(op, fmt.Errorf("call #%d: %d bytes for %s: expected at most %d per peer and op", seq, len(p), g.describe(q), maxFrame-len(head)))
			}
			frame := append([]byte(nil), head...)
			if err := w.send(to, deadline, enc(frame).frame(len(p)), p); err != nil {
				w.mu.Lock()
				closed := w.closedBy(g, to)
				w.mu.Unlock()
				if closed != nil { // not a failure of the world: the peer left
					return nil, seq, c.wrap(op, fmt.Errorf("call #%d: %w", seq, closed))
				}
				// The connection broke: its reader says why (the peer is
				// gone) as soon as it sees the end; give it a moment.
				select {
				case <-w.failed:
				case <-time.After(time.Second):
					w.fail(fmt.Errorf("world rank %d is gone: %w (%w) (%w)", to, err, ErrPeerGone, comm.ErrAborted), true)
				}
				return nil, seq, c.wrap(op, fmt.Errorf("call #%d: %w", seq, w.failure()))
			}
		}
		for q, from := range g.members {
			if q == c.rank {
				continue
			}
			m, err := w.recv(g, msgKey{g.id, seq, from}, deadline)
			switch {
			case errors.Is(err, errDeadline):
				var missing []string
				for r := q; r < len(g.members); r++ {
					if r != c.rank && (r == q || !w.arrived(msgKey{g.id, seq, g.members[r]})) {
						missing = append(missing, g.describe(r))
					}
				}
				why := ""
				if silent, since := w.silent(2 * w.heartbeat()); len(silent) > 0 {
					why = fmt.Sprintf("; unreachable: world ranks %s (nothing heard from them for %v: their host, or the link to it, is down)", joinRanks(silent), since.Round(time.Millisecond))
				}
				err = c.wrap(op, fmt.Errorf("call #%d: %s did not arrive within %v%s (%w)",
					seq, strings.Join(missing, ", "), w.opts.timeout, why, comm.ErrTimeout))
				w.fail(err, true)
				return nil, seq, err
			case err != nil:
				return nil, seq, c.wrap(op, fmt.Errorf("call #%d: %w", seq, err))
			}
			msgs[q] = m
		}
	}
	if local != nil {
		return nil, seq, fmt.Errorf("tcp: %w", local)
	}
	for q, m := range msgs {
		if m.h.failed {
			return nil, seq, c.wrap(op, fmt.Errorf("call #%d: %s failed: %s", seq, g.describe(q), m.h.sig))
		}
	}
	for q, m := range msgs {
		if m.h.sig != msgs[0].h.sig {
			return nil, seq, c.wrap(op, fmt.Errorf("call #%d: rank 0 called %s, %s called %s (%w)",
				seq, msgs[0].h.sig, g.describe(q), m.h.sig, comm.ErrMismatch))
		}
	}
	return msgs, seq, nil
}

// checkPayload checks that a peer's payload has the expected size.
func (c *Comm) checkPayload(op string, seq uint64, q int, m *message, want int) error {
	if len(m.payload) != want {
		return c.wrap(op, fmt.Errorf("call #%d: %s sent %d bytes, expected %d", seq, c.g.describe(q), len(m.payload), want))
	}
	return nil
}

func (c *Comm) AllGather(dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	op := comm.OpAllGather
	local := hostops.FirstErr(comm.CheckAllGather(c, dst, src), c.hostOnly(op, dst, src))
	var h header
	var p []byte
	if local == nil {
		h.sig = fmt.Sprintf("all-gather of %v", hostops.ShapeOf(src))
		p = encode(src, 0, src.Numel())
	}
	msgs, seq, err := c.exchange(op, h, local, func(int) []byte { return p })
	if err != nil {
		return nil, err
	}
	part := src.Numel()
	hostops.CopyElems(dst, c.rank*part, src, 0, part)
	for q, m := range msgs {
		if q == c.rank {
			continue
		}
		if err := c.checkPayload(op, seq, q, m, len(p)); err != nil {
			return nil, err
		}
		decodeInto(dst, q*part, m.payload)
	}
	return comm.Done, nil
}

func (c *Comm) ReduceScatter(dst, src *tensor.Tensor, rop comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	op := comm.OpReduceScatter
	local := hostops.FirstErr(comm.CheckReduceScatter(c, dst, src, rop), c.hostOnly(op, dst, src))
	var h header
	part := 0
	if local == nil {
		h.sig = fmt.Sprintf("reduce-scatter(%v) of %v", rop, hostops.ShapeOf(src))
		part = dst.Numel()
	}
	msgs, seq, err := c.exchange(op, h, local, func(q int) []byte { return encode(src, q*part, part) })
	if err != nil {
		return nil, err
	}
	acc := make([]float64, part)
	for q, m := range msgs {
		var v []float64
		if q == c.rank {
			v = hostops.Widen(src, c.rank*part, part)
		} else {
			if err := c.checkPayload(op, seq, q, m, part*src.DType().Size()); err != nil {
				return nil, err
			}
			v = widenBytes(src.DType(), m.payload)
		}
		hostops.Accumulate(acc, v, q == 0, rop)
	}
	hostops.Finish(acc, rop, len(msgs))
	hostops.Narrow(dst, acc)
	return comm.Done, nil
}

func (c *Comm) AllReduce(buf *tensor.Tensor, rop comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	op := comm.OpAllReduce
	local := hostops.FirstErr(comm.CheckAllReduce(c, buf, rop), c.hostOnly(op, buf))
	var h header
	var p []byte
	if local == nil {
		h.sig = fmt.Sprintf("all-reduce(%v) of %v", rop, hostops.ShapeOf(buf))
		if c.Size() > 1 {
			p = encode(buf, 0, buf.Numel())
		}
	}
	msgs, seq, err := c.exchange(op, h, local, func(int) []byte { return p })
	if err != nil {
		return nil, err
	}
	n := buf.Numel()
	acc := make([]float64, n)
	for q, m := range msgs {
		var v []float64
		if q == c.rank {
			v = hostops.Widen(buf, 0, n)
		} else {
			if err := c.checkPayload(op, seq, q, m, len(p)); err != nil {
				return nil, err
			}
			v = widenBytes(buf.DType(), m.payload)
		}
		hostops.Accumulate(acc, v, q == 0, rop)
	}
	hostops.Finish(acc, rop, len(msgs))
	hostops.Narrow(buf, acc)
	return comm.Done, nil
}

func (c *Comm) Broadcast(buf *tensor.Tensor, root int, s comm.Stream) (comm.Work, error) {
	op := comm.OpBroadcast
	local := hostops.FirstErr(comm.CheckBroadcast(c, buf, root), c.hostOnly(op, buf))
	var h header
	var p []byte
	if local == nil {
		h.sig = fmt.Sprintf("broadcast from rank %d of %v", root, hostops.ShapeOf(buf))
		if c.rank == root && c.Size() > 1 {
			p = encode(buf, 0, buf.Numel())
		}
	}
	msgs, seq, err := c.exchange(op, h, local, func(int) []byte { return p })
	if err != nil {
		return nil, err
	}
	if c.rank != root {
		m := msgs[root]
		if err := c.checkPayload(op, seq, root, m, buf.Bytes()); err != nil {
			return nil, err
		}
		decodeInto(buf, 0, m.payload)
	}
	return comm.Done, nil
}

func (c *Comm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	op := comm.OpAllToAllV
	local := hostops.FirstErr(comm.CheckAllToAllV(c, dst, src, sendCounts, recvCounts), c.hostOnly(op, dst, src))
	P := c.Size()
	var h header
	row := 0
	var sendOff []int // first row of each part of src
	if local == nil {
		h.sig = fmt.Sprintf("all-to-all-v of %v rows %v", src.DType(), append(tensor.Shape{-1}, src.Shape()[1:]...))
		for _, n := range sendCounts {
			h.ints = append(h.ints, int64(n))
		}
		for _, n := range recvCounts {
			h.ints = append(h.ints, int64(n))
		}
		row = tensor.Shape(src.Shape()[1:]).Numel()
		sendOff = prefixSums(sendCounts)
	}
	msgs, seq, err := c.exchange(op, h, local, func(q int) []byte {
		return encode(src, sendOff[q]*row, sendCounts[q]*row)
	})
	if err != nil {
		return nil, err
	}
	// Every rank holds every rank's counts: check all pairs, so that every
	// rank reports the same disagreement.
	for q, m := range msgs {
		if len(m.h.ints) != 2*P {
			return nil, c.wrap(op, fmt.Errorf("call #%d: %s sent %d counts, expected %d", seq, c.g.describe(q), len(m.h.ints), 2*P))
		}
	}
	for i, from := range msgs {
		for j, to := range msgs {
			if sent, want := from.h.ints[j], to.h.ints[P+i]; sent != want {
				return nil, c.wrap(op, fmt.Errorf("call #%d: %s sends %d rows to %s, which expects %d from it (%w)",
					seq, c.g.describe(i), sent, c.g.describe(j), want, comm.ErrMismatch))
			}
		}
	}
	recvOff := prefixSums(recvCounts)
	for q, m := range msgs {
		n := recvCounts[q] * row
		if q == c.rank {
			hostops.CopyElems(dst, recvOff[q]*row, src, sendOff[q]*row, n)
			continue
		}
		if err := c.checkPayload(op, seq, q, m, n*dst.DType().Size()); err != nil {
			return nil, err
		}
		decodeInto(dst, recvOff[q]*row, m.payload)
	}
	return comm.Done, nil
}

func (c *Comm) Barrier() error {
	_, _, err := c.exchange(comm.OpBarrier, header{sig: "barrier"}, nil, nil)
	return err
}

// Split implements comm.Comm; the new groups are labelled by this group's
// label and the color ("world/1[1 3]").
func (c *Comm) Split(color, key int) (comm.Comm, error) { return c.SplitNamed(color, key, "") }

// SplitNamed is Split with a label for the new groups ("tp" makes "tp[2 3]").
// It is one exchange of (color, key, label); every rank then forms its group
// from what all ranks sent, so no further round is needed.
func (c *Comm) SplitNamed(color, key int, label string) (comm.Comm, error) {
	op := comm.OpSplit
	var local error
	if color < 0 && color != comm.NoColor {
		local = comm.Errorf(c, op, "color %d: expected ≥ 0 or comm.NoColor (%d)", color, comm.NoColor)
	}
	h := header{sig: fmt.Sprintf("split %q", label), ints: []int64{int64(color), int64(key)}, label: label}
	msgs, seq, err := c.exchange(op, h, local, nil)
	if err != nil {
		return nil, err
	}
	if color == comm.NoColor {
		return nil, nil // a nil interface, not a nil *Comm
	}
	var ranks []int // group ranks of my color, ordered by key then rank
	for q, m := range msgs {
		if len(m.h.ints) != 2 {
			return nil, c.wrap(op, fmt.Errorf("call #%d: %s sent %d integers, expected color and key", seq, c.g.describe(q), len(m.h.ints)))
		}
		if m.h.ints[0] == int64(color) {
			ranks = append(ranks, q)
		}
	}
	slices.SortStableFunc(ranks, func(a, b int) int { return cmp.Compare(msgs[a].h.ints[1], msgs[b].h.ints[1]) })
	members := make([]int, len(ranks))
	me := 0
	for i, q := range ranks {
		members[i] = c.g.members[q]
		if q == c.rank {
			me = i
		}
	}
	lbl := msgs[ranks[0]].h.label
	if lbl == "" {
		lbl = fmt.Sprintf("%s/%d", c.g.label, color)
	}
	id := fmt.Sprintf("%s.%d.%d", c.g.id, seq, color)
	return &Comm{g: newGroup(c.g.w, id, lbl, members), rank: me}, nil
}

// hostOnly checks that every tensor is in host memory.
func (c *Comm) hostOnly(op string, ts ...*tensor.Tensor) error {
	return hostops.HostOnly(c, op, "comm/tcp", ts...)
}

func prefixSums(counts []int) []int {
	out := make([]int, len(counts))
	s := 0
	for i, n := range counts {
		out[i] = s
		s += n
	}
	return out
}
