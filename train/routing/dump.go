package routing

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
)

const magic = "ASYNCTP-ROUTING1"

// File is a rank's dump file in dir.
func File(dir string, rank int) string {
	return filepath.Join(dir, fmt.Sprintf("rank-%05d.routing", rank))
}

// Layer is one MoE layer as the dump reads it: its name, its router (whose
// last choices are dumped) and its token group (the rank's place in it
// and its size).
type Layer struct {
	Name        string
	Router      *layers.Router
	Rank, Ranks int
}

// GPTLayers lists the MoE layers of the single-rank model.
func GPTLayers(m *layers.GPT) []Layer {
	var ls []Layer
	for _, blk := range m.Blocks {
		if blk.MoE != nil {
			ls = append(ls, Layer{Name: blk.MoE.Name, Router: blk.MoE.Router, Rank: 0, Ranks: 1})
		}
	}
	return ls
}

// ModelLayers lists the MoE layers of a rank's sharded model, each with
// its token group.
func ModelLayers(m *model.Model) []Layer {
	var ls []Layer
	for _, blk := range m.Blocks {
		if mb, ok := blk.(*model.MoEBlock); ok {
			g := mb.MoE.Dispatch.TokenGroup()
			ls = append(ls, Layer{Name: mb.MoE.Name, Router: mb.MoE.Router, Rank: g.Rank(), Ranks: g.Size()})
		}
	}
	return ls
}

// Dump writes one rank's records.
type Dump struct {
	f      *os.File
	w      *bufio.Writer
	b      tensor.Backend
	layers []Layer
	err    error // the first failure; nothing is written after it
}

// Open opens world rank's dump file in dir for the MoE layers ls, whose
// routers run on b: truncated for a new run, appended to when resume is
// set.
func Open(dir string, rank int, resume bool, b tensor.Backend, ls []Layer) (*Dump, error) {
	if len(ls) == 0 {
		return nil, fmt.Errorf("routing dump %s: the model has no MoE layers, expected an MoE model", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("routing dump: %w", err)
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if resume {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(File(dir, rank), flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("routing dump: %w", err)
	}
	d := &Dump{f: f, w: bufio.NewWriterSize(f, 1<<20), b: b, layers: ls}
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		d.w.WriteString(magic)
	}
	return d, nil
}

// Write appends the routing of the last forward (step's) of every MoE
// layer. It reads the choices back to the host (a sync per layer: the
// dump's cost, only when it is on). A failure is kept, and returned by
// Close; nothing is written after it. A nil Dump writes nothing.
func (d *Dump) Write(step int) {
	if d == nil || d.err != nil {
		return
	}
	for l, rl := range d.layers {
		idx := rl.Router.IndicesDevice()
		if idx == nil || len(idx.Shape()) != 2 {
			d.err = fmt.Errorf("routing dump: step %d: MoE layer %s has no routing (%v), expected (tokens, top-k) choices", step, rl.Name, idx)
			return
		}
		n, k := idx.Dim(0), idx.Dim(1)
		h := tensor.MustHost(tensor.Int32, n, k)
		d.b.Download(h, idx)
		if err := d.b.Err(); err != nil {
			d.err = fmt.Errorf("routing dump: step %d: reading the routing of %s: %w", step, rl.Name, err)
			return
		}
		hdr := []uint32{uint32(step), uint32(l), uint32(rl.Rank), uint32(rl.Ranks), uint32(n), uint32(k)}
		binary.Write(d.w, binary.LittleEndian, hdr)
		binary.Write(d.w, binary.LittleEndian, uint16(len(rl.Name)))
		d.w.WriteString(rl.Name)
		ids := make([]uint16, n*k)
		for i, e := range h.I32() {
			if e < 0 || e > 0xffff {
				d.err = fmt.Errorf("routing dump: step %d: %s routes a token to expert %d, expected [0, 65535]", step, rl.Name, e)
				return
			}
			ids[i] = uint16(e)
		}
		if err := binary.Write(d.w, binary.LittleEndian, ids); err != nil {
			d.err = fmt.Errorf("routing dump: %w", err)
			return
		}
	}
	if err := d.w.Flush(); err != nil {
		d.err = fmt.Errorf("routing dump: %w", err)
	}
}

// Close flushes and closes the file and returns the dump's first error.
// A nil Dump returns nil.
func (d *Dump) Close() error {
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
		return fmt.Errorf("routing dump: %w", err)
	}
	return nil
}

// Then is a train.WithLateExtraMetrics function that writes the dump of
// step before extra's fields are queued (right after the step's forward
// and backward). A nil Dump returns extra.
func (d *Dump) Then(extra func(step int) func() (map[string]any, error)) func(step int) func() (map[string]any, error) {
	if d == nil {
		return extra
	}
	return func(step int) func() (map[string]any, error) {
		d.Write(step)
		return extra(step)
	}
}
