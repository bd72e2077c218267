package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
)

// The routing dump (--dump-routing DIR) and its comparison (train
// routing-diff DIR1 DIR2): for every training step and MoE layer, each
// token's top-k experts, so that two runs — one process against EP 2 × DP
// 2, the CPU against the GPU — can be compared token by token.
//
// Each rank writes DIR/rank-NNNNN.routing (its world rank): a 16-byte
// magic, then one record per step and MoE layer, little-endian:
//
//	u32 step, u32 layer (the MoE layers' ordinal, 0 first), u32 rank, u32 ranks
//	(the layer's token group: the rank's place in it, and its size), u32 tokens,
//	u32 topk, u16 name length, the name, tokens·topk u16 expert ids
//	(row-major, the router's order)
//
// The token group's ranks route consecutive slices of the step's tokens
// in rank order (parallel/model: every world rank its own slice of the
// global batch), so the slices of ranks 0..ranks−1 concatenated are the
// step's tokens in the global order, the single-rank run's. A new run
// truncates the files; a resumed run appends to them, and the later
// record of a step replaces the earlier (a resume repeats the steps after
// its checkpoint). When the flag is unset nothing of this runs.

const routingMagic = "ASYNCTP-ROUTING1"

// routingFile is a rank's dump file in dir.
func routingFile(dir string, rank int) string {
	return filepath.Join(dir, fmt.Sprintf("rank-%05d.routing", rank))
}

// routedLayer is one MoE layer as the dump reads it.
type routedLayer struct {
	name        string
	router      *layers.Router
	rank, ranks int
}

// routingDump writes one rank's records.
type routingDump struct {
	f      *os.File
	w      *bufio.Writer
	b      tensor.Backend
	layers []routedLayer
	err    error // the first failure; nothing is written after it
}

// gptRouted lists the MoE layers of the single-rank model.
func gptRouted(m *layers.GPT) []routedLayer {
	var ls []routedLayer
	for _, blk := range m.Blocks {
		if blk.MoE != nil {
			ls = append(ls, routedLayer{name: blk.MoE.Name, router: blk.MoE.Router, rank: 0, ranks: 1})
		}
	}
	return ls
}

// shardedRouted lists the MoE layers of a rank's sharded model, each with
// its token group.
func shardedRouted(m *model.Model) []routedLayer {
	var ls []routedLayer
	for _, blk := range m.Blocks {
		if mb, ok := blk.(*model.MoEBlock); ok {
			g := mb.MoE.Dispatch.TokenGroup()
			ls = append(ls, routedLayer{name: mb.MoE.Name, router: mb.MoE.Router, rank: g.Rank(), ranks: g.Size()})
		}
	}
	return ls
}

// openRoutingDump opens world rank's dump file in cfg.DumpRouting (nil
// when the flag is unset): truncated for a new run, appended to on a
// resume.
func openRoutingDump(cfg Config, rank int, b tensor.Backend, ls []routedLayer) (*routingDump, error) {
	if cfg.DumpRouting == "" {
		return nil, nil
	}
	if len(ls) == 0 {
		return nil, fmt.Errorf("--dump-routing %s: the model has no MoE layers, expected --experts", cfg.DumpRouting)
	}
	if err := os.MkdirAll(cfg.DumpRouting, 0o755); err != nil {
		return nil, fmt.Errorf("--dump-routing: %w", err)
	}
	path := routingFile(cfg.DumpRouting, rank)
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if cfg.Train.Resume != "" {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--dump-routing: %w", err)
	}
	d := &routingDump{f: f, w: bufio.NewWriterSize(f, 1<<20), b: b, layers: ls}
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		d.w.WriteString(routingMagic)
	}
	return d, nil
}

// write appends the routing of the last forward (step's) of every MoE
// layer. It reads the choices back to the host (a sync per layer: the
// dump's cost, only when it is on).
func (d *routingDump) write(step int) {
	if d == nil || d.err != nil {
		return
	}
	for l, rl := range d.layers {
		idx := rl.router.IndicesDevice()
		if idx == nil || len(idx.Shape()) != 2 {
			d.err = fmt.Errorf("--dump-routing: step %d: MoE layer %s has no routing (%v), expected (tokens, top-k) choices", step, rl.name, idx)
			return
		}
		n, k := idx.Dim(0), idx.Dim(1)
		h := tensor.MustHost(tensor.Int32, n, k)
		d.b.Download(h, idx)
		if err := d.b.Err(); err != nil {
			d.err = fmt.Errorf("--dump-routing: step %d: reading the routing of %s: %w", step, rl.name, err)
			return
		}
		hdr := []uint32{uint32(step), uint32(l), uint32(rl.rank), uint32(rl.ranks), uint32(n), uint32(k)}
		binary.Write(d.w, binary.LittleEndian, hdr)
		binary.Write(d.w, binary.LittleEndian, uint16(len(rl.name)))
		d.w.WriteString(rl.name)
		ids := make([]uint16, n*k)
		for i, e := range h.I32() {
			if e < 0 || e > 0xffff {
				d.err = fmt.Errorf("--dump-routing: step %d: %s routes a token to expert %d, expected [0, 65535]", step, rl.name, e)
				return
			}
			ids[i] = uint16(e)
		}
		if err := binary.Write(d.w, binary.LittleEndian, ids); err != nil {
			d.err = fmt.Errorf("--dump-routing: %w", err)
			return
		}
	}
	if err := d.w.Flush(); err != nil {
		d.err = fmt.Errorf("--dump-routing: %w", err)
	}
}

// close flushes and closes the file and returns the dump's first error.
func (d *routingDump) close() error {
	if d == nil {
		return nil
	}
	err := d.w.Flush()
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	if d.err != nil {
		return d.err
	}
	if err != nil {
		return fmt.Errorf("--dump-routing: %w", err)
	}
	return nil
}

// withDump runs the dump of step before the metrics' extra fields are
// queued (right after the step's forward and backward).
func (d *routingDump) withDump(extra func(int) func() (map[string]any, error)) func(int) func() (map[string]any, error) {
	if d == nil {
		return extra
	}
	return func(step int) func() (map[string]any, error) {
		d.write(step)
		return extra(step)
	}
}

// routingKey names one record.
type routingKey struct{ step, layer int }

// routingSlice is one rank's part of a record.
type routingSlice struct {
	name        string
	ranks, topk int
	ids         []uint16
}

// routingSet is a whole dump: per step and MoE layer, each token's sorted
// top-k set in the global token order.
type routingSet struct {
	dir   string
	topk  map[routingKey]int
	names map[routingKey]string
	sets  map[routingKey][]uint16 // tokens·topk, each token's ids sorted
}

// readRouting reads every rank file of dir and assembles the global
// order.
func readRouting(dir string) (*routingSet, error) {
	files, err := filepath.Glob(filepath.Join(dir, "rank-*.routing"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("routing-diff: %s: no rank-NNNNN.routing files, expected the directory of a --dump-routing run", dir)
	}
	parts := map[routingKey]map[int]routingSlice{}
	for _, f := range files {
		if err := readRoutingFile(f, parts); err != nil {
			return nil, err
		}
	}
	s := &routingSet{dir: dir, topk: map[routingKey]int{}, names: map[routingKey]string{}, sets: map[routingKey][]uint16{}}
	for key, ranks := range parts {
		var first routingSlice
		for _, p := range ranks {
			first = p
			break
		}
		var all []uint16
		for r := range first.ranks {
			p, ok := ranks[r]
			if !ok {
				return nil, fmt.Errorf("routing-diff: %s: step %d, MoE layer %d (%s): no record of token-group rank %d of %d", dir, key.step, key.layer, first.name, r, first.ranks)
			}
			if p.ranks != first.ranks || p.topk != first.topk {
				return nil, fmt.Errorf("routing-diff: %s: step %d, MoE layer %d: rank %d has %d ranks of top-%d, rank 0 %d of top-%d: expected the records of one run",
					dir, key.step, key.layer, r, p.ranks, p.topk, first.ranks, first.topk)
			}
			all = append(all, p.ids...)
		}
		if len(ranks) != first.ranks {
			return nil, fmt.Errorf("routing-diff: %s: step %d, MoE layer %d: records of %d ranks, expected %d", dir, key.step, key.layer, len(ranks), first.ranks)
		}
		for t := 0; t < len(all); t += first.topk {
			slices.Sort(all[t : t+first.topk])
		}
		s.topk[key], s.names[key], s.sets[key] = first.topk, first.name, all
	}
	return s, nil
}

func readRoutingFile(path string, parts map[routingKey]map[int]routingSlice) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("routing-diff: %w", err)
	}
	if !bytes.HasPrefix(data, []byte(routingMagic)) {
		return fmt.Errorf("routing-diff: %s: expected a --dump-routing file (magic %q)", path, routingMagic)
	}
	r := bytes.NewReader(data[len(routingMagic):])
	for rec := 0; ; rec++ {
		var hdr [6]uint32
		if err := binary.Read(r, binary.LittleEndian, &hdr); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("routing-diff: %s: record %d: truncated header (%v)", path, rec, err)
		}
		var nl uint16
		if err := binary.Read(r, binary.LittleEndian, &nl); err != nil {
			return fmt.Errorf("routing-diff: %s: record %d: truncated (%v)", path, rec, err)
		}
		name := make([]byte, nl)
		if _, err := io.ReadFull(r, name); err != nil {
			return fmt.Errorf("routing-diff: %s: record %d: truncated name (%v)", path, rec, err)
		}
		step, layer, rank, ranks, n, k := int(hdr[0]), int(hdr[1]), int(hdr[2]), int(hdr[3]), int(hdr[4]), int(hdr[5])
		if ranks < 1 || rank >= ranks || k < 1 || n*k > r.Len()/2 {
			return fmt.Errorf("routing-diff: %s: record %d: rank %d of %d, %d tokens of top-%d with %d bytes left: expected a rank inside its group and the ids in the file",
				path, rec, rank, ranks, n, k, r.Len())
		}
		ids := make([]uint16, n*k)
		if err := binary.Read(r, binary.LittleEndian, ids); err != nil {
			return fmt.Errorf("routing-diff: %s: record %d: %v", path, rec, err)
		}
		key := routingKey{step, layer}
		if parts[key] == nil {
			parts[key] = map[int]routingSlice{}
		}
		parts[key][rank] = routingSlice{name: string(name), ranks: ranks, topk: k, ids: ids} // a later record replaces an earlier one
	}
}

// stepDiff is one step's comparison.
type stepDiff struct {
	step          int
	tokens, diffs int   // token-layers compared, those whose top-k set differs
	perLayer      []int // differing tokens per MoE layer
	first         string
}

// routingDiff compares a and b step by step over their common steps;
// only lists the steps only one of them has.
func routingDiff(a, b *routingSet) (steps []stepDiff, only []string, err error) {
	bySteps := func(s *routingSet) map[int][]int {
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
			only = append(only, fmt.Sprintf("step %d only in %s", st, a.dir))
		}
	}
	for st := range sb {
		if _, ok := sa[st]; !ok {
			only = append(only, fmt.Sprintf("step %d only in %s", st, b.dir))
		}
	}
	sort.Ints(common)
	sort.Strings(only)
	for _, st := range common {
		la, lb := sa[st], sb[st]
		sort.Ints(la)
		sort.Ints(lb)
		if !slices.Equal(la, lb) {
			return nil, nil, fmt.Errorf("routing-diff: step %d: MoE layers %v in %s, %v in %s: expected the same model", st, la, a.dir, lb, b.dir)
		}
		d := stepDiff{step: st, perLayer: make([]int, len(la))}
		for i, l := range la {
			key := routingKey{st, l}
			x, y, k := a.sets[key], b.sets[key], a.topk[key]
			if len(x) != len(y) || k != b.topk[key] {
				return nil, nil, fmt.Errorf("routing-diff: step %d, MoE layer %d (%s): %d tokens of top-%d in %s, %d of top-%d in %s: expected the same batch",
					st, l, a.names[key], len(x)/k, k, a.dir, len(y)/b.topk[key], b.topk[key], b.dir)
			}
			for t := 0; t < len(x); t += k {
				if !slices.Equal(x[t:t+k], y[t:t+k]) {
					d.perLayer[i]++
					if d.first == "" {
						d.first = fmt.Sprintf("MoE layer %d (%s), token %d: experts %v vs %v", l, a.names[key], t/k, x[t:t+k], y[t:t+k])
					}
				}
			}
			d.tokens += len(x) / k
			d.diffs += d.perLayer[i]
		}
		steps = append(steps, d)
	}
	return steps, only, nil
}

// runRoutingDiff is `train routing-diff DIR1 DIR2`: it prints, per common
// step, the token-layers whose top-k set differs, and fails (exit status
// 1) naming the first step with a difference when there is one.
func runRoutingDiff(args []string) error {
	fs := flag.NewFlagSet("train routing-diff", flag.ContinueOnError)
	quiet := fs.Bool("quiet", false, "print only the steps that differ and the summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("routing-diff: expected two --dump-routing directories, found %q", fs.Args())
	}
	a, err := readRouting(fs.Arg(0))
	if err != nil {
		return err
	}
	b, err := readRouting(fs.Arg(1))
	if err != nil {
		return err
	}
	steps, only, err := routingDiff(a, b)
	if err != nil {
		return err
	}
	for _, o := range only {
		fmt.Println("routing-diff:", o)
	}
	if len(steps) == 0 {
		return errors.New("routing-diff: no common steps to compare")
	}
	total, tokens, first := 0, 0, -1
	for _, d := range steps {
		total += d.diffs
		tokens += d.tokens
		if d.diffs > 0 && first < 0 {
			first = d.step
		}
		if *quiet && d.diffs == 0 {
			continue
		}
		per := make([]string, len(d.perLayer))
		for i, n := range d.perLayer {
			per[i] = fmt.Sprint(n)
		}
		line := fmt.Sprintf("step %d: %d of %d token-layers differ (per MoE layer: %s)", d.step, d.diffs, d.tokens, strings.Join(per, " "))
		if d.first != "" {
			line += "; first: " + d.first
		}
		fmt.Println(line)
	}
	if first < 0 {
		fmt.Printf("routing-diff: identical: %d steps, %d token-layers\n", len(steps), tokens)
		return nil
	}
	return fmt.Errorf("routing-diff: %d of %d token-layers differ over %d steps; first difference at step %d", total, tokens, len(steps), first)
}
