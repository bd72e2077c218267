package cudabackend

import (
	"cmp"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// ---------------------------------------------------------------------------
// The memory ledger (WithMemLedger): which code holds the allocator's
// blocks when the bytes in use peak. Each block is attributed to its call
// site, the first frame of the allocating goroutine's stack outside the
// allocator, Zeros and internal/layerkit.Ensure or the layers' shared workspace (a layer's Ensure of a field, the
// optimizer's Zeros, an op's scratch); the ledger keeps the bytes in use per
// site and copies them whenever the total in use reaches a new high. Off (the
// default) it costs one nil check per allocation and per free.

// WithMemLedger turns the memory ledger on (see Backend.MemLedger). The
// blocks allocated with it on are attributed to their call sites; it costs a
// stack walk per allocation, none per op.
func WithMemLedger() Option { return func(c *config) { c.ledger = true } }

type ledgerBlock struct {
	site      int
	requested int64
}

type siteStat struct {
	bytes, requested int64 // reserved size classes and requested bytes held now
	blocks           int
}

type ledger struct {
	names  []string       // site names, by index
	index  map[string]int // site name → index
	blocks map[gpu.Ptr]ledgerBlock
	now    []siteStat // held now, by site
	peak   []siteStat // held when the bytes in use peaked
	// The allocator's figures when the bytes in use peaked.
	peakLive, peakCached int64
}

func newLedger() *ledger {
	return &ledger{index: make(map[string]int), blocks: make(map[gpu.Ptr]ledgerBlock)}
}

// skipFrame reports whether a frame is part of the allocation path rather
// than its call site.
func skipFrame(fn string) bool {
	switch strings.TrimPrefix(fn, modulePath) {
	case "tensor/cudabackend.(*Backend).newBuffer", "tensor/cudabackend.(*Backend).Zeros",
		"tensor/cudabackend.(*Backend).scratch", "internal/layerkit.Ensure", "layers.(*workspace).ensure", "layers.(*workspace).keep":
		return true
	}
	return strings.HasPrefix(fn, modulePath+"tensor/cudabackend.(*allocator).")
}

const modulePath = "github.com/asynctp/asynctp/"

// callSite names the caller of the allocation: "pkg.(*T).Method file.go:line"
// (closures are named by their function).
func callSite() string {
	var pcs [24]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if !skipFrame(f.Function) {
			fn := strings.TrimPrefix(f.Function, modulePath)
			fn = strings.TrimPrefix(fn, "tensor/")
			for strings.Contains(fn, ".func") { // a closure: its function's name
				fn = fn[:strings.LastIndex(fn, ".func")]
			}
			return fmt.Sprintf("%s %s:%d", fn, filepath.Base(f.File), f.Line)
		}
		if !more {
			return "unknown"
		}
	}
}

// add records a block handed out; the allocator holds its lock.
func (l *ledger) add(p gpu.Ptr, site string, requested, size int64, live, cached int64) {
	i, ok := l.index[site]
	if !ok {
		i = len(l.names)
		l.index[site] = i
		l.names = append(l.names, site)
		l.now = append(l.now, siteStat{})
	}
	l.blocks[p] = ledgerBlock{site: i, requested: requested}
	s := &l.now[i]
	s.bytes += size
	s.requested += requested
	s.blocks++
	if live > l.peakLive {
		l.peakLive, l.peakCached = live, cached
		l.peak = append(l.peak[:0], l.now...)
	}
}

// remove records a block given back; the allocator holds its lock.
func (l *ledger) remove(p gpu.Ptr, size int64) {
	b, ok := l.blocks[p]
	if !ok {
		return // allocated before the ledger (cannot happen: it starts with the backend)
	}
	delete(l.blocks, p)
	s := &l.now[b.site]
	s.bytes -= size
	s.requested -= b.requested
	s.blocks--
}

// MemSite is one line of a MemReport: the bytes one call site (or one
// category of sites) held when the bytes in use peaked.
type MemSite struct {
	Site     string // "layers.(*AttentionCore).InputsPacked attention.go:118", or a category
	Category string
	// Bytes is the size classes the site's blocks reserve, Requested the
	// bytes asked for (Bytes − Requested is the rounding), Blocks their
	// number.
	Bytes, Requested int64
	Blocks           int
}

// MemReport is the memory ledger's account (Backend.MemLedger).
type MemReport struct {
	// PeakReserved is the most bytes reserved from the device at once
	// (MemStats.Peak). PeakInUse is the most bytes handed out to tensors and
	// op workspaces at once (size classes), CachedAtPeak the free blocks the
	// allocator kept at that moment: PeakInUse + CachedAtPeak was reserved
	// then.
	PeakReserved, PeakInUse, CachedAtPeak int64
	// Sites are the blocks held at the in-use peak by call site, most
	// bytes first; their Bytes add up to PeakInUse.
	Sites []MemSite
}

// MemLedger returns the ledger's account so far, or false when the backend
// was opened without WithMemLedger.
func (b *Backend) MemLedger() (MemReport, bool) {
	a := b.alloc
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.ledger
	if l == nil {
		return MemReport{}, false
	}
	r := MemReport{PeakReserved: a.peak, PeakInUse: l.peakLive, CachedAtPeak: l.peakCached}
	for i, s := range l.peak {
		if s.blocks == 0 {
			continue
		}
		r.Sites = append(r.Sites, MemSite{Site: l.names[i], Category: SiteCategory(l.names[i]),
			Bytes: s.bytes, Requested: s.requested, Blocks: s.blocks})
	}
	slices.SortStableFunc(r.Sites, func(x, y MemSite) int { return cmp.Compare(y.Bytes, x.Bytes) })
	return r, true
}

// Memory categories of SiteCategory.
const (
	CatParams      = "parameters and gradients"
	CatOptimizer   = "optimizer state (fp32 master, m, v)"
	CatActivations = "layers' forward buffers (saved for backward)"
	CatBackward    = "layers' backward buffers"
	CatStream      = "decoder: residual stream, final norm, their gradients"
	CatHead        = "LM head: logits chunk, weight gradient, targets"
	CatWorkspace   = "op workspaces (backend scratch)"
	CatOther       = "other"
)

// SiteCategory sorts a ledger call site into a category by the function
// that allocated: the parameter set, the optimizer, the decoder's buffers,
// the head, the layers' forward and backward buffers, the backend's own
// scratch.
func SiteCategory(site string) string {
	fn, _, _ := strings.Cut(site, " ")
	switch {
	case strings.HasPrefix(fn, "layers.(*ParamSet)."):
		return CatParams
	case strings.HasPrefix(fn, "optim.NewAdamW"), strings.HasPrefix(fn, "optim.NewShardedAdamW"):
		return CatOptimizer
	case strings.HasPrefix(fn, "layers.(*Decoder)."):
		return CatStream
	case strings.HasPrefix(fn, "layers.(*ChunkedHeadLoss)."), strings.HasPrefix(fn, "layers.(*CrossEntropy)."):
		return CatHead
	case strings.HasPrefix(fn, "cudabackend."):
		return CatWorkspace
	case strings.HasPrefix(fn, "layers.") && (strings.Contains(fn, "Backward") || strings.Contains(fn, "OutputGrad")):
		return CatBackward
	case strings.HasPrefix(fn, "layers."):
		return CatActivations
	}
	return CatOther
}

// Categories sums the report's sites by category, most bytes first.
func (r MemReport) Categories() []MemSite {
	var out []MemSite
	idx := map[string]int{}
	for _, s := range r.Sites {
		i, ok := idx[s.Category]
		if !ok {
			i = len(out)
			idx[s.Category] = i
			out = append(out, MemSite{Site: s.Category, Category: s.Category})
		}
		out[i].Bytes += s.Bytes
		out[i].Requested += s.Requested
		out[i].Blocks += s.Blocks
	}
	slices.SortStableFunc(out, func(x, y MemSite) int { return cmp.Compare(y.Bytes, x.Bytes) })
	return out
}

// Write prints the report: the peaks, the categories at the in-use peak
// with the allocator's slack (rounding to size classes, cached free blocks),
// then the sites when sites is true.
func (r MemReport) Write(w io.Writer, sites bool) {
	mib := func(n int64) string { return fmt.Sprintf("%9.1f MiB", float64(n)/(1<<20)) }
	var req int64
	for _, s := range r.Sites {
		req += s.Requested
	}
	fmt.Fprintf(w, "memory ledger: peak reserved %s, peak in use %s (+ %s cached then)\n",
		strings.TrimSpace(mib(r.PeakReserved)), strings.TrimSpace(mib(r.PeakInUse)), strings.TrimSpace(mib(r.CachedAtPeak)))
	fmt.Fprintf(w, "  at the in-use peak, by category (size classes; requested bytes):\n")
	for _, c := range r.Categories() {
		fmt.Fprintf(w, "  %s  %s  %-55s %5d blocks\n", mib(c.Bytes), mib(c.Requested), c.Site, c.Blocks)
	}
	fmt.Fprintf(w, "  %s  %16s  %s\n", mib(r.PeakInUse-req), "", "slack: rounding to size classes")
	fmt.Fprintf(w, "  %s  %16s  %s\n", mib(r.CachedAtPeak), "", "slack: cached free blocks at the in-use peak")
	fmt.Fprintf(w, "  %s  %16s  %s\n", mib(r.PeakReserved-r.PeakInUse-r.CachedAtPeak), "", "slack: reserved at another moment (peak reserved − reserved at the in-use peak)")
	if !sites {
		return
	}
	fmt.Fprintf(w, "  by call site:\n")
	for _, s := range r.Sites {
		fmt.Fprintf(w, "  %s  %s  %-70s %5d blocks\n", mib(s.Bytes), mib(s.Requested), s.Site, s.Blocks)
	}
}
