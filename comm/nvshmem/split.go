package nvshmem

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Split implements comm.Comm; the new groups are labelled by this group's
// label and the color ("world/1[1 3]").
func (c *Comm) Split(color, key int) (comm.Comm, error) {
	return c.SplitNamed(color, key, "")
}

// SplitNamed is Split with a label for the new groups ("tp" makes "tp[2 3]").
//
// It is collective over c, and runs in four steps:
//  1. the ranks all-gather (color, key, staging slots in use) over c;
//  2. each new group takes the lowest staging slot that none of its members
//     uses (groups of one rank need none);
//  3. if c has an NVSHMEM team, every rank of c calls
//     nvshmem_team_split_strided once for each new group whose ranks are
//     evenly strided in c, in increasing order (the groups of a Grid are),
//     in color order: those groups get a team and NVSHMEM's collectives;
//     the others (e.g. keys that reverse the order) run on the P2P kernels;
//  4. each rank zeroes the signal words of its new group's slot, and the
//     ranks of c meet at a barrier before anyone uses a new group.
//
// A group that has neither a team nor P2P between all its ranks cannot run
// collectives: its ranks get an error, the others their groups. Splits,
// AllocSymmetric and FreeSymmetric of one world must not run concurrently.
func (c *Comm) SplitNamed(color, key int, label string) (comm.Comm, error) {
	const op = comm.OpSplit
	if err := comm.CheckSplit(c, color, key); err != nil {
		return nil, err
	}
	if err := c.usable(op); err != nil {
		return nil, err
	}
	w := c.w
	w.splitMu.Lock()
	defer w.splitMu.Unlock()

	w.mu.Lock()
	used := w.used
	w.mu.Unlock()
	entries, err := c.splitExchange(color, key, used)
	if err != nil {
		return nil, err
	}
	groups := splitGroups(entries, comm.NoColor)
	var mine *splitGroup
	for i := range groups {
		if groups[i].color == color {
			mine = &groups[i]
		}
	}
	var myErr error
	slot := -1
	if mine != nil && len(mine.ranks) > 1 {
		slot, myErr = chooseSlot(*mine, entries, w.opts.maxGroups)
	}

	// Teams, made by every rank of c for every group that can have one.
	team := -1
	if c.team >= 0 {
		if err := c.drain(op); err != nil {
			return nil, err
		}
		for _, g := range groups {
			start, stride, ok := g.strided()
			if !ok || len(g.ranks) < 2 {
				continue
			}
			var t int
			err := w.blocking(fmt.Sprintf("nvshmem_team_split_strided(%s, start %d, stride %d, size %d)", c.name, start, stride, len(g.ranks)),
				time.Now().Add(w.opts.timeout), func() error {
					v, err := cTeamSplit(c.team, start, stride, len(g.ranks))
					t = v
					return err
				})
			if err != nil {
				return nil, comm.Errorf(c, op, "%w", err)
			}
			if mine != nil && g.color == mine.color {
				team = t
			}
		}
	}

	var child *Comm
	if mine != nil && myErr == nil {
		members := make([]int, len(mine.ranks))
		for i, q := range mine.ranks {
			members[i] = c.members[q]
		}
		if label == "" {
			label = c.label + "/" + strconv.Itoa(color)
		}
		child, myErr = newComm(w, label, slices.Index(mine.ranks, c.rank), members, slot, team, false)
	}
	// No rank may use its new group before every member has zeroed its
	// signal words: meet on c.
	if err := c.Barrier(); err != nil {
		if child != nil {
			child.mu.Lock()
			child.closed = true
			child.mu.Unlock()
			child.release()
		}
		return nil, err
	}
	if myErr != nil {
		if team >= 0 {
			cTeamDestroy(team)
		}
		return nil, comm.Errorf(c, op, "color %d: %w", color, myErr)
	}
	if child == nil {
		return nil, nil // comm.NoColor
	}
	return child, nil
}

// splitExchange all-gathers every rank's color, key and slots in use over
// c, through device memory and c's own all-gather.
func (c *Comm) splitExchange(color, key int, used uint64) ([]splitEntry, error) {
	const op = comm.OpSplit
	me := []float64{float64(int32(color)), float64(int32(key)), float64(int32(uint32(used))), float64(int32(uint32(used >> 32)))}
	if c.size == 1 {
		return []splitEntry{{color: color, key: key, used: used}}, nil
	}
	m := &DeviceMemory{dev: c.w.dev}
	src, err := m.Alloc(tensor.Int32, 4)
	if err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	dst, err := m.Alloc(tensor.Int32, 4*c.size)
	if err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	defer src.Buffer().(*DeviceBuffer).Free()
	defer dst.Buffer().(*DeviceBuffer).Free()
	h := tensor.MustHost(tensor.Int32, 4)
	h.SetFloat64s(me)
	if err := m.Upload(src, h); err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	wk, err := c.AllGather(dst, src, nil)
	if err == nil {
		err = wk.Wait(nil)
	}
	if err != nil {
		var ce *comm.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, comm.Errorf(c, op, "all-gather of colors and keys: %w", err)
	}
	all := tensor.MustHost(tensor.Int32, 4*c.size)
	if err := m.Download(all, dst); err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	v := all.I32()
	entries := make([]splitEntry, c.size)
	for q := range entries {
		entries[q] = splitEntry{color: int(v[4*q]), key: int(v[4*q+1]), used: uint64(uint32(v[4*q+2])) | uint64(uint32(v[4*q+3]))<<32}
	}
	return entries, nil
}
