package nvshmem

import (
	"fmt"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/gpuwork"
	"github.com/asynctp/asynctp/tensor"
)

// StreamHandle is a CUDA stream given by its handle (a cudaStream_t or
// CUstream), for callers that have no *cuda.Stream; 0 is the legacy default
// stream.
type StreamHandle uintptr

// Handle returns the stream's handle.
func (h StreamHandle) Handle() uintptr { return uintptr(h) }

// handler is what a comm.Stream must offer: *cuda.Stream and StreamHandle do.
type handler interface{ Handle() uintptr }

// streamOf returns the handle of a comm.Stream (ok false for nil).
func streamOf(s comm.Stream) (h uint64, ok bool, err error) {
	switch v := s.(type) {
	case nil:
		return 0, false, nil
	case handler:
		return uint64(v.Handle()), true, nil
	}
	return 0, false, fmt.Errorf("stream %T: expected nil, a *cuda.Stream or another value with Handle() uintptr (e.g. nvshmem.StreamHandle)", s)
}

// devicePointer is what a tensor's buffer must offer to be moved: the device
// address of its element 0 (tensor/cudabackend's Buffer, DeviceBuffer and
// SymmetricBuffer do).
type devicePointer interface{ Ptr() uint64 }

// pointer is the device address of t's first element, after checking that t
// lives on the group's GPU in memory the transport can address.
func (c *Comm) pointer(op, what string, t *tensor.Tensor) (uint64, error) {
	want := tensor.Device{Kind: tensor.CUDA, Index: c.w.dev}
	if t.Device() != want {
		return 0, comm.Errorf(c, op, "%s %v: expected a tensor on %v", what, t, want)
	}
	b, ok := t.Buffer().(devicePointer)
	if !ok {
		return 0, comm.Errorf(c, op, "%s %v: its buffer (%T) has no Ptr() uint64: expected a tensor of tensor/cudabackend, DeviceMemory or AllocSymmetric", what, t, t.Buffer())
	}
	p := b.Ptr()
	if p == 0 && t.Numel() > 0 {
		return 0, comm.Errorf(c, op, "%s %v: expected device memory, found a buffer with none (freed, or a failed allocation)", what, t)
	}
	return p + uint64(t.Offset()*t.DType().Size()), nil
}

// symmetric reports whether t lies on this world's symmetric heap.
func (c *Comm) symmetric(t *tensor.Tensor) bool {
	b, ok := t.Buffer().(*SymmetricBuffer)
	return ok && b.w == c.w && !b.freed.Load()
}

func overlaps(a uint64, an int64, b uint64, bn int64) bool {
	return an > 0 && bn > 0 && a < b+uint64(bn) && b < a+uint64(an)
}

// start queues an op on the group's stream, after the caller's stream s
// (unless s is nil), and returns its Work. enqueue queues the op itself on
// the group's stream st; the tensors in keep stay alive until it is done.
func (c *Comm) start(op string, s comm.Stream, keep []*tensor.Tensor, enqueue func(st, seq uint64) error) (comm.Work, error) {
	user, hasUser, err := streamOf(s)
	if err != nil {
		return nil, comm.Errorf(c, op, "%v", err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, comm.Errorf(c, op, "%w", comm.ErrClosed)
	}
	if err := c.w.failure(); err != nil {
		c.mu.Unlock()
		return nil, comm.Errorf(c, op, "the world failed earlier: %w", err)
	}
	dev := c.w.dev
	seq := c.seq.Add(1)
	queued := time.Now()
	var ev uint64
	if hasUser {
		err = cEventRecord(dev, c.inEv, user)
		if err == nil {
			err = cStreamWaitEvent(dev, c.stream, c.inEv)
		}
		if err != nil {
			c.mu.Unlock()
			return nil, comm.Errorf(c, op, "ordering it after stream %#x: %w", user, err)
		}
	}
	err = enqueue(c.stream, seq)
	if err == nil {
		if ev, err = c.w.event(); err == nil {
			err = cEventRecord(dev, ev, c.stream)
		}
	}
	if err != nil {
		c.mu.Unlock()
		// Part of the op may be queued and the other ranks wait for the
		// rest: the world cannot go on.
		err = fmt.Errorf("%s #%d on %s, world rank %d: queueing it: %w (%w)", op, seq, c.name, c.w.rank, err, comm.ErrAborted)
		c.w.fail(err)
		return nil, comm.Errorf(c, op, "%w", err)
	}
	wk := &work{c: c, op: op, seq: seq, keep: keep, State: gpuwork.State[uint64]{Ev: ev, Fin: make(chan struct{})},
		deadline: queued.Add(c.w.opts.timeout + grace(c.w.opts.timeout))}
	c.pending = append(c.pending, wk)
	c.mu.Unlock()
	c.w.wake()
	return wk, nil
}

// noPath is the error of an op that neither the team nor the P2P kernels
// can run on this group.
func (c *Comm) noPath(op, why string) error {
	return comm.Errorf(c, op, "%s: expected a group whose ranks all reach each other by P2P (the exchange kernels), found ranks that do not", why)
}

// teamReduces reports whether the group's team can reduce dt.
func (c *Comm) teamReduces(dt tensor.DType) bool {
	return c.team >= 0 && (dt != tensor.BFloat16 || c.w.lib.BF16Reduce)
}

// AllGather implements comm.Comm: on a team, NVSHMEM's fcollect (directly
// when both tensors are symmetric and disjoint, else staged); otherwise the
// exchange kernels.
func (c *Comm) AllGather(dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = comm.OpAllGather
	if err := comm.CheckAllGather(c, dst, src); err != nil {
		return nil, err
	}
	pd, err := c.pointer(op, "dst", dst)
	if err != nil {
		return nil, err
	}
	ps, err := c.pointer(op, "src", src)
	if err != nil {
		return nil, err
	}
	bytes := int64(src.Bytes())
	inPlace := ps == pd+uint64(int64(c.rank)*bytes)
	if overlaps(pd, int64(dst.Bytes()), ps, bytes) && !inPlace {
		return nil, comm.Errorf(c, op, "src %v overlaps dst %v: expected src to be rank %d's part of dst (in place) or disjoint", src, dst, c.rank)
	}
	if bytes == 0 {
		return comm.Done, nil
	}
	keep := []*tensor.Tensor{dst, src}
	dev := c.w.dev
	switch {
	case c.size == 1:
		return c.start(op, s, keep, func(st, _ uint64) error {
			if inPlace {
				return nil
			}
			return cMemcpyAsync(dev, pd, ps, bytes, st)
		})
	case c.team >= 0:
		direct := c.symmetric(dst) && c.symmetric(src) && !inPlace
		scratch, sb := c.staging()
		return c.start(op, s, keep, func(st, _ uint64) error {
			return cTeamAllGather(c.team, c.size, pd, ps, bytes, direct, scratch, sb, st)
		})
	case c.p2p:
		x := allGatherPlan(c.size, c.rank, bytes)
		return c.start(op, s, keep, func(st, seq uint64) error { return c.cExchange(x, ps, pd, 0, 0, seq, st) })
	}
	return nil, c.noPath(op, "no team")
}

// ReduceScatter implements comm.Comm: on a team that reduces the dtype,
// NVSHMEM's reducescatter (directly when both tensors are symmetric and
// disjoint, else staged); otherwise the exchange kernels, which reduce in
// fp32 (f64 for f64) in rank order.
func (c *Comm) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	const name = comm.OpReduceScatter
	if err := comm.CheckReduceScatter(c, dst, src, op); err != nil {
		return nil, err
	}
	pd, err := c.pointer(name, "dst", dst)
	if err != nil {
		return nil, err
	}
	ps, err := c.pointer(name, "src", src)
	if err != nil {
		return nil, err
	}
	part := int64(dst.Bytes())
	inPlace := pd == ps+uint64(int64(c.rank)*part)
	if overlaps(pd, part, ps, int64(src.Bytes())) && !inPlace {
		return nil, comm.Errorf(c, name, "dst %v overlaps src %v: expected dst to be rank %d's part of src (in place) or disjoint", dst, src, c.rank)
	}
	if part == 0 {
		return comm.Done, nil
	}
	keep := []*tensor.Tensor{dst, src}
	dt, n := dst.DType(), int64(dst.Numel())
	switch {
	case c.size == 1:
		return c.start(name, s, keep, func(st, _ uint64) error {
			if inPlace {
				return nil
			}
			return cMemcpyAsync(c.w.dev, pd, ps, part, st)
		})
	case c.teamReduces(dt):
		direct := c.symmetric(dst) && c.symmetric(src) && !inPlace && c.w.lib.ReduceScatter
		scratch, sb := c.staging()
		return c.start(name, s, keep, func(st, _ uint64) error {
			return cTeamReduceScatter(c.team, c.size, pd, ps, n, int(dt), int(op), direct, scratch, sb, st)
		})
	case c.p2p:
		x := reduceScatterPlan(c.size, c.rank, part)
		return c.start(name, s, keep, func(st, seq uint64) error { return c.cExchange(x, ps, pd, int(dt), int(op), seq, st) })
	}
	return nil, c.noPath(name, fmt.Sprintf("no team that reduces %v", dt))
}

// AllReduce implements comm.Comm: on a team that reduces the dtype,
// NVSHMEM's reduce (staged); otherwise the exchange kernels, as a
// reduce-scatter in place followed by an all-gather of the reduced parts.
func (c *Comm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	const name = comm.OpAllReduce
	if err := comm.CheckAllReduce(c, buf, op); err != nil {
		return nil, err
	}
	pb, err := c.pointer(name, "buf", buf)
	if err != nil {
		return nil, err
	}
	dt, n := buf.DType(), int64(buf.Numel())
	if n == 0 || c.size == 1 {
		if err := c.usable(name); err != nil {
			return nil, err
		}
		return comm.Done, nil
	}
	keep := []*tensor.Tensor{buf}
	switch {
	case c.teamReduces(dt):
		scratch, sb := c.staging()
		return c.start(name, s, keep, func(st, _ uint64) error {
			return cTeamAllReduce(c.team, c.size, pb, n, int(dt), int(op), scratch, sb, st)
		})
	case c.p2p:
		rs, ag := allReducePlans(c.size, c.rank, n, dt.Size())
		return c.start(name, s, keep, func(st, seq uint64) error {
			if rs.moves() {
				if err := c.cExchange(rs, pb, pb, int(dt), int(op), seq, st); err != nil {
					return err
				}
			}
			if ag.moves() {
				return c.cExchange(ag, pb, pb, 0, 0, seq, st)
			}
			return nil
		})
	}
	return nil, c.noPath(name, fmt.Sprintf("no team that reduces %v", dt))
}

// Broadcast implements comm.Comm: on a team, NVSHMEM's broadcast (staged);
// otherwise the exchange kernels.
func (c *Comm) Broadcast(buf *tensor.Tensor, root int, s comm.Stream) (comm.Work, error) {
	const op = comm.OpBroadcast
	if err := comm.CheckBroadcast(c, buf, root); err != nil {
		return nil, err
	}
	pb, err := c.pointer(op, "buf", buf)
	if err != nil {
		return nil, err
	}
	bytes := int64(buf.Bytes())
	if bytes == 0 || c.size == 1 {
		if err := c.usable(op); err != nil {
			return nil, err
		}
		return comm.Done, nil
	}
	keep := []*tensor.Tensor{buf}
	switch {
	case c.team >= 0:
		scratch, sb := c.staging()
		return c.start(op, s, keep, func(st, _ uint64) error {
			return cTeamBroadcast(c.team, c.rank, root, pb, bytes, scratch, sb, st)
		})
	case c.p2p:
		x := broadcastPlan(c.size, c.rank, root, bytes)
		return c.start(op, s, keep, func(st, seq uint64) error {
			if !x.moves() {
				return nil
			}
			return c.cExchange(x, pb, pb, 0, 0, seq, st)
		})
	}
	return nil, c.noPath(op, "no team")
}

// AllToAllV implements comm.Comm on the exchange kernels (NVSHMEM has no
// all-to-all with uneven counts), which need every pair of ranks of the
// group to reach each other by P2P.
func (c *Comm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	const op = comm.OpAllToAllV
	if err := comm.CheckAllToAllV(c, dst, src, sendCounts, recvCounts); err != nil {
		return nil, err
	}
	pd, err := c.pointer(op, "dst", dst)
	if err != nil {
		return nil, err
	}
	ps, err := c.pointer(op, "src", src)
	if err != nil {
		return nil, err
	}
	if overlaps(pd, int64(dst.Bytes()), ps, int64(src.Bytes())) {
		return nil, comm.Errorf(c, op, "dst %v overlaps src %v: expected disjoint tensors", dst, src)
	}
	rowBytes := int64(tensor.Shape(dst.Shape()[1:]).Numel() * dst.DType().Size())
	x, err := allToAllPlan(c.size, c.rank, rowBytes, sendCounts, recvCounts)
	if err != nil {
		return nil, comm.Errorf(c, op, "%v", err)
	}
	if !x.moves() {
		if err := c.usable(op); err != nil {
			return nil, err
		}
		return comm.Done, nil
	}
	keep := []*tensor.Tensor{dst, src}
	switch {
	case c.size == 1:
		return c.start(op, s, keep, func(st, _ uint64) error {
			return cMemcpyAsync(c.w.dev, pd+uint64(x.selfDstOff), ps+uint64(x.selfSrcOff), x.selfBytes, st)
		})
	case c.p2p:
		return c.start(op, s, keep, func(st, seq uint64) error { return c.cExchange(x, ps, pd, 0, 0, seq, st) })
	}
	return nil, c.noPath(op, "all-to-all-v between ranks that are not all P2P-connected (across nodes) is not implemented yet")
}

// Barrier implements comm.Comm: a one-block kernel in which every rank sets
// a word on every other and waits for theirs, queued after the group's ops
// and waited for on the host.
func (c *Comm) Barrier() error {
	const op = comm.OpBarrier
	if c.size == 1 {
		return c.usable(op)
	}
	w, err := c.start(op, nil, nil, func(st, seq uint64) error {
		c.barGen++
		return c.cBarrier(c.barGen, seq, st)
	})
	if err != nil {
		return err
	}
	return w.Wait(nil)
}
