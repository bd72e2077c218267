package strategies

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/peerep"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Names are the strategies a configuration names (overlap.Names without
// "auto", which picks among them).
var Names = []string{"collective", "pipelined", "fused"}

// NeedsSymmetric says what the strategies built on symmetric memory need
// from a group's transport.
const NeedsSymmetric = "symmetric memory with peer pointers (comm.SymmetricMemory: NVSHMEM's, alone or beside NCCL's collectives)"

// Options configure the strategies of All.
type Options struct {
	// Chunks is the exchange form's matmul∘all-reduce chunks (0: 4).
	Chunks int
	// Transfer and PutCTAs are the fused all-gathers' transfer
	// (peercopy.Engine: "pull", the default, or "put").
	Transfer string
	PutCTAs  int
	// Timeout bounds the fused sites' waits for a peer (0: 10 s).
	Timeout time.Duration
	// StreamHooks runs the fused sites with the GEMM engine's waits and
	// signals as separate work around the backend's ordinary GEMMs (no
	// overlap): the kernel emulator's form (peercopy.Engine.StreamHooks,
	// peerep.WithStreamHooks), which tests use on the CPU.
	StreamHooks bool
	// Expert are options of every expert path built (peerep.Option).
	Expert []peerep.Option
}

// All returns one strategy per name of Names, configured by o.
func All(o Options) []overlap.Strategy {
	return []overlap.Strategy{overlap.Collective{}, Pipelined{Options: o}, Fused{Options: o}}
}

// Available returns the strategies of all (All's, when nil) that can build
// a site of sp (its kind, group, backend, sizes and dtype), and for each of
// the others why not (wrapping overlap.ErrUnavailable, or the error that
// makes a setting invalid).
func Available(sp overlap.Spec, all []overlap.Strategy) (run []overlap.Strategy, not map[string]error) {
	if all == nil {
		all = All(Options{})
	}
	not = map[string]error{}
	for _, s := range all {
		if err := s.Supports(sp); err != nil {
			not[s.Name()] = err
			continue
		}
		run = append(run, s)
	}
	return run, not
}

// peerCopy is why the site of sp cannot use the peer-copy forms (nil: it
// can): its group needs symmetric memory whose ranks all reach each other
// by loads and stores, and its backend must be the CUDA backend on a
// stream.
func peerCopy(sp overlap.Spec, name string) error {
	what := fmt.Sprintf("%s for %s site %q", name, sp.Kind, sp.Name)
	if sp.Group == nil {
		return fmt.Errorf("%s: nil group", what)
	}
	if _, ok := comm.SymmetricOf(sp.Group); !ok {
		return fmt.Errorf("%s: group %s has no symmetric memory: it needs %s (%w)", what, sp.Group.Name(), NeedsSymmetric, overlap.ErrUnavailable)
	}
	if far, all := comm.Unreachable(sp.Group); !all {
		members, _ := comm.MembersOf(sp.Group)
		return fmt.Errorf("%s: group %s spans hosts: %s not reachable by loads and stores from rank %d (another node; its symmetric memory has no peer pointers there) (%w)",
			what, sp.Group.Name(), rankNames(far, members), sp.Group.Rank(), overlap.ErrUnavailable)
	}
	b, ok := sp.Backend.(*cudabackend.Backend)
	if !ok || (b.OnGPU() && b.Stream() == nil && sp.Kind != overlap.KindExpert) {
		return fmt.Errorf("%s: backend %T: expected the CUDA backend on a CUDA stream (%w)", what, sp.Backend, overlap.ErrUnavailable)
	}
	return nil
}

// rankNames names the group ranks rs ("group ranks 2, 3 (world ranks 6,
// 7) are"), with their world ranks where the group's members are known.
func rankNames(rs, members []int) string {
	if len(rs) == 0 {
		return "some pairs of its ranks are"
	}
	list := func(rs []int) string {
		s := make([]string, len(rs))
		for i, r := range rs {
			s[i] = fmt.Sprint(r)
		}
		return strings.Join(s, ", ")
	}
	unit := "group ranks "
	if len(rs) == 1 {
		unit = "group rank "
	}
	out := unit + list(rs)
	if len(members) > 0 && !slices.ContainsFunc(rs, func(r int) bool { return r >= len(members) }) {
		world := make([]int, len(rs))
		for i, r := range rs {
			world[i] = members[r]
		}
		w := "world ranks "
		if len(rs) == 1 {
			w = "world rank "
		}
		out += " (" + w + list(world) + ")"
	}
	if len(rs) == 1 {
		return out + " is"
	}
	return out + " are"
}

// Pipelined is the strategy "pipelined": the communication cut into
// chunks, the math of each chunk as soon as it has landed, the own shard's
// first, on a lane (a side stream on the GPU, a goroutine on the CPU).
//
//	site kind                forward / backward                         transfer                                   requirements
//	all-gather∘matmul        own shard's matmul, then each peer's       peer-copy: copy-engine pulls of each       peer-copy: symmetric memory reached by
//	matmul∘reduce-scatter    chunk in ring order as it lands; the       peer's stage, gated by stream-written      loads and stores on every pair, the CUDA
//	                         backwards are the adjoint sites            signal words; exchange: P−1 all-to-all-v   backend on a stream; exchange: any group
//	                         (overlap.Exchange's schedule)              steps with one peer each
//	matmul∘all-reduce        the rows in Chunks chunks, each            the group's all-reduce (either form)       any group
//	                         all-reduced while the next computes
//	expert (MoE)             device-side dispatch → grouped GEMMs →     stores into the owners' symmetric receive  symmetric memory reached by loads and
//	                         combine (parallel/ep/peerep.Path);         buffers through peer pointers, epoch        stores on every pair, the CUDA backend,
//	                         backward the reverse, same handle          signals                                    a bound on the tokens (ep.Parallel.MaxTokens)
//
// Where the site's group and backend offer the peer-copy form it runs
// (overlap/peercopy's Chunked for the TP sites, parallel/ep/peerep's
// Expert for the expert path); elsewhere the TP sites run the exchange
// form (overlap.Exchange), and the expert path,
// which has no exchange form, is refused (an explicit request) or stays
// collective (a default), saying why.
type Pipelined struct{ Options Options }

var (
	_ overlap.Strategy  = Pipelined{}
	_ ep.ExpertStrategy = Pipelined{}
)

// Name is "pipelined".
func (Pipelined) Name() string { return "pipelined" }

func (p Pipelined) expert() peerep.Expert { return peerep.Expert{Options: p.Options.Expert} }

// tp is the implementation of the TP site of sp: the peer-copy form
// where the group and backend offer it, else the exchange form.
func (p Pipelined) tp(sp overlap.Spec) overlap.Builder {
	if peerCopy(sp, "pipelined") == nil {
		return peercopy.Chunked{Chunks: p.Options.Chunks}
	}
	return overlap.Exchange{Chunks: p.Options.Chunks}
}

// Supports says whether a site of sp can run, and if not why.
func (p Pipelined) Supports(sp overlap.Spec) error {
	if sp.Kind == overlap.KindExpert {
		if err := peerCopy(sp, "pipelined"); err != nil {
			return err
		}
		return p.expert().Supports(sp)
	}
	return p.tp(sp).Supports(sp)
}

// Via says how the site of sp moves its data (overlap.Describer).
func (p Pipelined) Via(sp overlap.Spec) (string, bool) {
	if sp.Kind == overlap.KindExpert {
		if p.Supports(sp) != nil {
			return "", false
		}
		return "stores through peer pointers into symmetric memory", true
	}
	// The exchange form's, and the peer-copy form's matmul∘all-reduce
	// sites, which are the exchange form's.
	if _, ok := p.tp(sp).(overlap.Exchange); ok || sp.Kind == overlap.KindMatmulAllReduce {
		return overlap.Exchange{}.Via(sp)
	}
	return "copy-engine pulls from symmetric memory", true
}

// NewAllGatherMatmul builds the site of sp in the form its group and
// backend offer.
func (p Pipelined) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	return p.tp(sp).NewAllGatherMatmul(sp)
}

// NewMatmulReduceScatter builds the site of sp in the form its group and
// backend offer.
func (p Pipelined) NewMatmulReduceScatter(sp overlap.Spec) (overlap.MatmulReduceScatter, error) {
	return p.tp(sp).NewMatmulReduceScatter(sp)
}

// NewMatmulAllReduce builds the site of sp: chunked all-reduces on the
// group's collectives in either form.
func (p Pipelined) NewMatmulAllReduce(sp overlap.Spec) (overlap.MatmulAllReduce, error) {
	return p.tp(sp).NewMatmulAllReduce(sp)
}

// NewExpertPath builds the expert path (peerep.Path); Supports has said
// whether the layer's group and backend can run it.
func (p Pipelined) NewExpertPath(c ep.ExpertConfig) (ep.ExpertPath, error) {
	return p.expert().NewExpertPath(c)
}

// Fused is the strategy "fused": one kernel does the math while the
// communication lands, waiting on each chunk's signal before it reads it.
//
//	site kind                forward / backward                          transfer                                   requirements
//	all-gather∘matmul        our GEMM engine from this rank's shard,     copy-engine pulls (Transfer "pull") or     symmetric memory reached by loads and
//	                         its producer waiting per chunk; backward    puts by a few CTAs of every peer ("put")   stores on every pair, the CUDA backend on
//	                         the fused matmul∘reduce-scatter             into this rank's symmetric buffer          a stream, an sm_90a GPU, bf16, widths of
//	matmul∘reduce-scatter    the engine stores the partial product,      the peers pull this rank's partial rows    multiples of 8
//	                         signalling each 128-row block; the rows     as they are signalled; fp32 sum in a
//	                         are summed in a fixed rank order            fixed rank order                           (peercopy.Engine)
//	matmul∘all-reduce        no fused form: refused, or collective       —                                          —
//	expert (MoE)             the grouped GEMM engine waits per 128-row   dispatch stores through peer pointers;     as pipelined's expert path, the grouped
//	                         block of the dispatch; the down projection  the down GEMM's blocks are sent home as    GEMM on (the MoE device step), bf16, the
//	                         sends its blocks home as it stores them     they are stored                            grouped GEMM engine (peerep.Expert, Fused)
type Fused struct{ Options Options }

var (
	_ overlap.Strategy  = Fused{}
	_ ep.ExpertStrategy = Fused{}
)

// Name is "fused".
func (Fused) Name() string { return "fused" }

// engine builds the TP sites, expert the expert path.
func (f Fused) engine() peercopy.Engine {
	o := f.Options
	return peercopy.Engine{Transfer: o.Transfer, PutCTAs: o.PutCTAs, Timeout: o.Timeout, StreamHooks: o.StreamHooks}
}

func (f Fused) expert() peerep.Expert {
	opts := f.Options.Expert
	if f.Options.StreamHooks {
		opts = append(append([]peerep.Option(nil), opts...), peerep.WithStreamHooks())
	}
	return peerep.Expert{Fused: true, Options: opts}
}

// Supports says whether a site of sp can run, and if not why.
func (f Fused) Supports(sp overlap.Spec) error {
	if sp.Kind == overlap.KindMatmulAllReduce {
		return fmt.Errorf("fused for %s site %q: the matmul∘all-reduce sites have no fused form (%w)", sp.Kind, sp.Name, overlap.ErrUnavailable)
	}
	if err := peerCopy(sp, "fused"); err != nil {
		return err
	}
	if sp.Kind == overlap.KindExpert {
		return f.expert().Supports(sp)
	}
	return f.engine().Supports(sp)
}

// Via says how the site of sp moves its data (overlap.Describer).
func (f Fused) Via(sp overlap.Spec) (string, bool) {
	switch {
	case sp.Kind == overlap.KindExpert:
		return "the grouped GEMM engine on symmetric memory", true
	case f.Options.Transfer == peercopy.TransferPut:
		return "the GEMM engine fed by puts into symmetric memory", true
	}
	return "the GEMM engine fed by copy-engine pulls from symmetric memory", true
}

// NewAllGatherMatmul builds the site of sp on the GEMM engine.
func (f Fused) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	if err := f.Supports(sp); err != nil {
		return nil, err
	}
	return f.engine().NewAllGatherMatmul(sp)
}

// NewMatmulReduceScatter builds the site of sp on the GEMM engine.
func (f Fused) NewMatmulReduceScatter(sp overlap.Spec) (overlap.MatmulReduceScatter, error) {
	if err := f.Supports(sp); err != nil {
		return nil, err
	}
	return f.engine().NewMatmulReduceScatter(sp)
}

// NewMatmulAllReduce refuses: no fused form.
func (f Fused) NewMatmulAllReduce(sp overlap.Spec) (overlap.MatmulAllReduce, error) {
	return nil, f.Supports(sp)
}

// NewExpertPath builds the fused expert path (peerep.Path in its fused
// mode).
func (f Fused) NewExpertPath(c ep.ExpertConfig) (ep.ExpertPath, error) {
	return f.expert().NewExpertPath(c)
}
