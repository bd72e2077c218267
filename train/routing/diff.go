package routing

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

// key names one record.
type key struct{ step, layer int }

// slice is one rank's part of a record.
type slice struct {
	name        string
	ranks, topk int
	ids         []uint16
}

// Set is a whole dump: per step and MoE layer, each token's sorted top-k
// set in the global token order.
type Set struct {
	Dir   string
	topk  map[key]int
	names map[key]string
	sets  map[key][]uint16 // tokens·topk, each token's ids sorted
}

// Read reads every rank file of dir and assembles the global order.
func Read(dir string) (*Set, error) {
	files, err := filepath.Glob(filepath.Join(dir, "rank-*.routing"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no rank-NNNNN.routing files, expected the directory of a routing dump", dir)
	}
	parts := map[key]map[int]slice{}
	for _, f := range files {
		if err := readFile(f, parts); err != nil {
			return nil, err
		}
	}
	s := &Set{Dir: dir, topk: map[key]int{}, names: map[key]string{}, sets: map[key][]uint16{}}
	for k, ranks := range parts {
		var first slice
		for _, p := range ranks {
			first = p
			break
		}
		var all []uint16
		for r := range first.ranks {
			p, ok := ranks[r]
			if !ok {
				return nil, fmt.Errorf("%s: step %d, MoE layer %d (%s): no record of token-group rank %d of %d", dir, k.step, k.layer, first.name, r, first.ranks)
			}
			if p.ranks != first.ranks || p.topk != first.topk {
				return nil, fmt.Errorf("%s: step %d, MoE layer %d: rank %d has %d ranks of top-%d, rank 0 %d of top-%d: expected the records of one run",
					dir, k.step, k.layer, r, p.ranks, p.topk, first.ranks, first.topk)
			}
			all = append(all, p.ids...)
		}
		if len(ranks) != first.ranks {
			return nil, fmt.Errorf("%s: step %d, MoE layer %d: records of %d ranks, expected %d", dir, k.step, k.layer, len(ranks), first.ranks)
		}
		for t := 0; t < len(all); t += first.topk {
			slices.Sort(all[t : t+first.topk])
		}
		s.topk[k], s.names[k], s.sets[k] = first.topk, first.name, all
	}
	return s, nil
}

func readFile(path string, parts map[key]map[int]slice) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(data, []byte(magic)) {
		return fmt.Errorf("%s: expected a routing dump file (magic %q)", path, magic)
	}
	r := bytes.NewReader(data[len(magic):])
	for rec := 0; ; rec++ {
		var hdr [6]uint32
		if err := binary.Read(r, binary.LittleEndian, &hdr); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: record %d: truncated header (%v)", path, rec, err)
		}
		var nl uint16
		if err := binary.Read(r, binary.LittleEndian, &nl); err != nil {
			return fmt.Errorf("%s: record %d: truncated (%v)", path, rec, err)
		}
		name := make([]byte, nl)
		if _, err := io.ReadFull(r, name); err != nil {
			return fmt.Errorf("%s: record %d: truncated name (%v)", path, rec, err)
		}
		step, layer, rank, ranks, n, k := int(hdr[0]), int(hdr[1]), int(hdr[2]), int(hdr[3]), int(hdr[4]), int(hdr[5])
		if ranks < 1 || rank >= ranks || k < 1 || n*k > r.Len()/2 {
			return fmt.Errorf("%s: record %d: rank %d of %d, %d tokens of top-%d with %d bytes left: expected a rank inside its group and the ids in the file",
				path, rec, rank, ranks, n, k, r.Len())
		}
		ids := make([]uint16, n*k)
		if err := binary.Read(r, binary.LittleEndian, ids); err != nil {
			return fmt.Errorf("%s: record %d: %v", path, rec, err)
		}
		kk := key{step, layer}
		if parts[kk] == nil {
			parts[kk] = map[int]slice{}
		}
		parts[kk][rank] = slice{name: string(name), ranks: ranks, topk: k, ids: ids} // a later record replaces an earlier one
	}
}

// StepDiff is one step's comparison.
type StepDiff struct {
	Step          int
	Tokens, Diffs int    // token-layers compared, those whose top-k set differs
	PerLayer      []int  // differing tokens per MoE layer
	First         string // the first difference, "" when none
}

// Diff compares a and b step by step over their common steps; only lists
// the steps only one of them has.
func Diff(a, b *Set) (steps []StepDiff, only []string, err error) {
	bySteps := func(s *Set) map[int][]int {
		m := map[int][]int{}
		for k := range s.sets {
			m[k.step] = append(m[k.step], k.layer)
		}
		return m
	}
	sa, sb := bySteps(a), bySteps(b)
	var common []int
	for st := range sa {
		if _, ok := sb[st]; ok {
			common = append(common, st)
		} else {
			only = append(only, fmt.Sprintf("step %d only in %s", st, a.Dir))
		}
	}
	for st := range sb {
		if _, ok := sa[st]; !ok {
			only = append(only, fmt.Sprintf("step %d only in %s", st, b.Dir))
		}
	}
	sort.Ints(common)
	sort.Strings(only)
	for _, st := range common {
		la, lb := sa[st], sb[st]
		sort.Ints(la)
		sort.Ints(lb)
		if !slices.Equal(la, lb) {
			return nil, nil, fmt.Errorf("step %d: MoE layers %v in %s, %v in %s: expected the same model", st, la, a.Dir, lb, b.Dir)
		}
		d := StepDiff{Step: st, PerLayer: make([]int, len(la))}
		for i, l := range la {
			kk := key{st, l}
			x, y, k := a.sets[kk], b.sets[kk], a.topk[kk]
			if len(x) != len(y) || k != b.topk[kk] {
				return nil, nil, fmt.Errorf("step %d, MoE layer %d (%s): %d tokens of top-%d in %s, %d of top-%d in %s: expected the same batch",
					st, l, a.names[kk], len(x)/k, k, a.Dir, len(y)/b.topk[kk], b.topk[kk], b.Dir)
			}
			for t := 0; t < len(x); t += k {
				if !slices.Equal(x[t:t+k], y[t:t+k]) {
					d.PerLayer[i]++
					if d.First == "" {
						d.First = fmt.Sprintf("MoE layer %d (%s), token %d: experts %v vs %v", l, a.names[kk], t/k, x[t:t+k], y[t:t+k])
					}
				}
			}
			d.Tokens += len(x) / k
			d.Diffs += d.PerLayer[i]
		}
		steps = append(steps, d)
	}
	return steps, only, nil
}
