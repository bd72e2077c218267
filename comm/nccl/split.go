package nccl

/*
#include <stdlib.h>
#include "atp_nccl.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/cuda"
)

// Split implements comm.Comm with ncclCommSplit; the new groups are labelled
// by this group's label and the color ("world/1[1 3]").
func (c *Comm) Split(color, key int) (comm.Comm, error) {
	return c.SplitNamed(color, key, "")
}

// SplitNamed is Split with a label for the new groups ("tp" makes "tp[2 3]").
//
// It is collective over c. The ranks first all-gather their (color, key)
// over c, so that each knows the world ranks of its new group (for Name and
// errors); then ncclCommSplit (non-blocking, comm.NoColor as
// NCCL_SPLIT_NOCOLOR) makes the new communicator, polled until ready within
// the op timeout. A rank that passes comm.NoColor gets (nil, nil).
func (c *Comm) SplitNamed(color, key int, label string) (comm.Comm, error) {
	const op = comm.OpSplit
	if err := comm.CheckSplit(c, color, key); err != nil {
		return nil, err
	}
	all, err := c.exchange(op, int32(color), int32(key))
	if err != nil {
		return nil, err
	}
	// The new group: the ranks of c with this color, by key, then by rank
	// in c (ncclCommSplit orders them the same way).
	var ranks []int
	if color != comm.NoColor {
		for q := range c.size {
			if int(all[2*q]) == color {
				ranks = append(ranks, q)
			}
		}
		slices.SortStableFunc(ranks, func(a, b int) int { return int(all[2*a+1]) - int(all[2*b+1]) })
	}
	members := make([]int, len(ranks))
	for i, q := range ranks {
		members[i] = c.members[q]
	}
	if label == "" {
		label = c.label + "/" + strconv.Itoa(color)
	}

	unbind, err := c.w.bind()
	if err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	defer unbind()
	start := time.Now()
	deadline := start.Add(c.w.opts.timeout)
	seq := c.seq.Add(1)
	ncolor := color
	if color == comm.NoColor {
		ncolor = ncclSplitNoColor
	}
	// NCCL writes the new handle from its init thread: into C memory.
	out := C.calloc(1, C.size_t(unsafe.Sizeof(C.atp_ncclComm(0))))
	hp := (*C.atp_ncclComm)(out)
	defer c.w.enter(c, op, seq, start, deadline)()
	c.mu.Lock()
	if err := c.usable(op); err != nil {
		c.mu.Unlock()
		C.free(out)
		return nil, err
	}
	r := Result(C.atp_ncclCommSplit(c.handle(), C.int(ncolor), C.int(key), hp, C.int(c.w.opts.blocking)))
	c.mu.Unlock()
	call := fmt.Sprintf("ncclCommSplit(color %d, key %d)", ncolor, key)
	switch r {
	case Success:
	case InProgress:
		// The split runs as an asynchronous job of the parent: the parent is
		// ncclInProgress until it is done.
		err = c.settle(call, deadline)
	default:
		err = newError(call, r)
	}
	h := C.atp_nccl_load_handle(hp)
	if err == nil && color != comm.NoColor && h == 0 {
		err = c.w.poll(deadline, func() (bool, error) { // should not wait
			h = C.atp_nccl_load_handle(hp)
			return h != 0, nil
		})
	}
	if err == nil && h != 0 {
		err = c.w.settleHandle(call, h, deadline)
	}
	if err != nil {
		if h != 0 {
			C.atp_ncclCommAbort(h)
		}
		// out is leaked on purpose: NCCL's init thread may still write it.
		return nil, c.failed(op, seq, start, err)
	}
	if color == comm.NoColor {
		C.free(out)
		return nil, nil // a nil interface, not a nil *Comm
	}
	child, err := newComm(c.w, h, out, slices.Index(members, c.w.rank), members, label, false)
	if err != nil {
		C.atp_ncclCommAbort(h)
		return nil, comm.Errorf(c, op, "%w", err)
	}
	return child, nil
}

// exchange all-gathers two int32 of every rank of c through its scratch
// memory, on its own stream, and waits for them on the host.
func (c *Comm) exchange(op string, a, b int32) ([]int32, error) {
	unbind, err := c.w.bind()
	if err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	defer unbind()
	mine := []int32{a, b}
	part := c.scratch.Offset(8 * c.rank)
	if err := cuda.UploadAsync(part, mine, c.stream); err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	ps, pd := uintptr(part), uintptr(c.scratch)
	wk, err := c.launch(op, c.stream, func(h C.atp_ncclComm) (string, Result, error) {
		return "ncclAllGather", Result(C.atp_ncclAllGather(C.uintptr_t(ps), C.uintptr_t(pd), 2, ncclInt32, h, stream(c.stream))), nil
	})
	if err != nil {
		return nil, err
	}
	if err := wk.Wait(nil); err != nil {
		return nil, err
	}
	all := make([]int32, 2*c.size)
	err = cuda.DownloadAsync(all, c.scratch, c.stream)
	if err == nil {
		err = c.stream.Synchronize()
	}
	if err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	return all, nil
}
