package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/asynctp/asynctp/launch"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/train"
)

// defaultCommTimeout is how long a rank waits for the others in a
// collective: a rank that stalls longer makes the run fail, naming it.
const defaultCommTimeout = 5 * time.Minute

// maxRanks bounds every size of the layout (the ranks are goroutines of one
// process).
const maxRanks = 4096

// ParallelConfig is the layout of a run, the "parallel" section of the
// config: World = DP × TP ranks, EP dividing the world. Zero sizes mean the
// defaults (TP, EP 1; DP World/TP when World is given, else 1; World
// DP × TP). With TP = DP = EP = 1 the run is the plain single-rank one.
//
// Comm is the transport between the ranks (the Comm* constants; empty: the
// default, see Config.resolveComm) and NProc the local processes --nproc
// starts (0: none, the ranks are goroutines or a launcher's processes).
type ParallelConfig struct {
	TP               int      `json:"tp"`
	DP               int      `json:"dp"`
	EP               int      `json:"ep"`
	World            int      `json:"world"`
	SequenceParallel bool     `json:"sequence_parallel"`
	CommTimeout      Duration `json:"comm_timeout"` // "5m0s"; a number is seconds
	Comm             string   `json:"comm,omitempty"`
	NProc            int      `json:"nproc,omitempty"`
	// The gradients' sums over the replicas (accum.go): their dtype
	// (--grad-reduce-dtype fp32 or bf16; empty: fp32), their buckets'
	// size in MiB (--grad-bucket-mb; 0: 25) and whether each bucket's sum
	// starts behind the backward (--overlap-grad-reduce; absent: true).
	GradReduceDType   string  `json:"grad_reduce_dtype,omitempty"`
	GradBucketMB      float64 `json:"grad_bucket_mb,omitempty"`
	OverlapGradReduce *bool   `json:"overlap_grad_reduce,omitempty"`
	// DistributedOptimizer shards the optimizer's state over the DP group
	// (--distributed-optimizer: model.Options.DistributedOptimizer).
	DistributedOptimizer bool `json:"distributed_optimizer,omitempty"`
}

// The transports --comm names.
const (
	CommLocal   = "local"   // goroutine ranks of one process over comm/local, CPU
	CommTCP     = "tcp"     // process ranks over comm/tcp, CPU
	CommNCCL    = "nccl"    // process ranks over comm/nccl, one GPU each
	CommNVSHMEM = "nvshmem" // process ranks over comm/nvshmem, GPUs may be shared
	// CommHybrid: process ranks, one GPU each; NCCL's collectives and
	// NVSHMEM's symmetric memory (launch.Hybrid).
	CommHybrid = launch.Hybrid
)

var comms = []string{CommLocal, CommTCP, CommNCCL, CommNVSHMEM, CommHybrid}

// Processes reports whether the ranks are processes (a transport other
// than comm/local).
func (p ParallelConfig) Processes() bool { return p.Comm != "" && p.Comm != CommLocal }

func defaultParallel() ParallelConfig {
	return ParallelConfig{TP: 1, EP: 1, CommTimeout: Duration(defaultCommTimeout)}
}

// Single reports whether the layout is one rank.
func (p ParallelConfig) Single() bool { return p.TP == 1 && p.DP == 1 && p.EP == 1 }

// String is the layout as the flags say it.
func (p ParallelConfig) String() string {
	s := fmt.Sprintf("tp %d × dp %d = %d ranks, ep %d, sequence parallel %s", p.TP, p.DP, p.TP*p.DP, p.EP, onOff(p.SequenceParallel))
	if p.DistributedOptimizer {
		s += ", distributed optimizer"
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// resolve fills in the defaults and checks the sizes against each other.
func (p ParallelConfig) resolve() (ParallelConfig, error) {
	for _, f := range []struct {
		name string
		v    int
	}{{"tp", p.TP}, {"dp", p.DP}, {"ep", p.EP}, {"world", p.World}, {"nproc", p.NProc}} {
		if f.v < 0 || f.v > maxRanks {
			return p, fmt.Errorf("layout: --%s %d, expected 1 to %d (or 0 for the default)", f.name, f.v, maxRanks)
		}
	}
	if p.TP == 0 {
		p.TP = 1
	}
	if p.EP == 0 {
		p.EP = 1
	}
	if p.DP == 0 {
		p.DP = 1
		if p.World > 0 {
			if p.World%p.TP != 0 {
				return p, fmt.Errorf("layout: --tp %d does not divide the world of %d ranks, expected world = dp × tp", p.TP, p.World)
			}
			p.DP = p.World / p.TP
		}
	}
	if p.World == 0 {
		p.World = p.DP * p.TP
	}
	if p.World != p.DP*p.TP {
		return p, fmt.Errorf("layout: a world of %d ranks with --dp %d × --tp %d = %d, expected world = dp × tp", p.World, p.DP, p.TP, p.DP*p.TP)
	}
	if p.CommTimeout < 0 {
		return p, fmt.Errorf("layout: --comm-timeout %v, expected a positive duration", time.Duration(p.CommTimeout))
	}
	if p.CommTimeout == 0 {
		p.CommTimeout = Duration(defaultCommTimeout)
	}
	return p, nil
}

// check validates the (resolved) layout against the model (defaults filled
// in) and the run, before any work: the same conditions model.New and
// model.Forward check, said in terms of the flags.
func (p ParallelConfig) check(m layers.GPTConfig, t train.Config) error {
	if p.SequenceParallel && p.TP == 1 {
		return fmt.Errorf("layout: --sequence-parallel splits the tokens over the TP group, which needs --tp > 1")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"heads", m.Heads}, {"kv-heads", m.KVHeads}, {"dim", m.Dim}, {"ffn", m.FFN}, {"vocab", m.Vocab}} {
		if f.v%p.TP != 0 {
			return fmt.Errorf("layout: --tp %d does not divide the model's %s = %d, expected TP dividing heads, kv-heads, dim, ffn and vocab", p.TP, f.name, f.v)
		}
	}
	if m.Experts == 0 && p.EP > 1 {
		return fmt.Errorf("layout: --ep %d spreads the experts of an MoE model, but the model is dense (set --experts)", p.EP)
	}
	if m.Experts > 0 {
		if p.World%p.EP != 0 {
			return fmt.Errorf("layout: --ep %d does not divide the world of %d ranks (dp %d × tp %d), expected EP dividing dp × tp", p.EP, p.World, p.DP, p.TP)
		}
		if m.Experts%p.EP != 0 {
			return fmt.Errorf("layout: --ep %d does not divide the %d experts, expected the experts divisible by EP", p.EP, m.Experts)
		}
		if m.TopK > m.Experts {
			return fmt.Errorf("layout: --topk %d exceeds the %d experts", m.TopK, m.Experts)
		}
	}
	if t.Batch%p.DP != 0 {
		return fmt.Errorf("layout: --batch %d is not divisible by --dp %d, expected each replica to take batch/dp sequences", t.Batch, p.DP)
	}
	if tokens := t.Batch / p.DP * t.Seq; (p.SequenceParallel || m.Experts > 0) && tokens%p.TP != 0 {
		return fmt.Errorf("layout: a replica's %d tokens (batch/dp × seq) are not divisible by --tp %d, as sequence parallelism and the MoE blocks need", tokens, p.TP)
	}
	return nil
}

// resolveComm picks the transport (--comm) and, for process ranks, the
// device, and checks them against each other and against how the ranks
// are started (l, --nproc), before any work:
//
//	local         goroutine ranks on the CPU (the default without processes)
//	tcp           process ranks on the CPU (the default with processes on the CPU)
//	nccl          process ranks on GPUs, one each (the default with --device cuda)
//	nvshmem       process ranks on GPUs, which they may share
//	nccl+nvshmem  process ranks on GPUs, one each: NCCL's collectives, NVSHMEM's
//	              symmetric memory for the pipelined and fused sites
//
// The default on GPUs stays nccl, also where libasynctp_nvshmem.so loads:
// the hybrid adds a second library and world to every run, and is chosen
// by asking for it (the start-up report says so).
//
// A world of processes must have as many ranks as there are processes.
func (c *Config) resolveComm(l origin) error {
	p := &c.Parallel
	procs := l.launched || p.NProc > 0
	if p.Comm == "" {
		switch {
		case !procs:
			p.Comm = CommLocal
		case c.Device == "cuda":
			p.Comm = CommNCCL
			c.commWhy = "the default with --device cuda; --comm nccl+nvshmem adds NVSHMEM's symmetric memory for the pipelined and fused sites"
		default:
			p.Comm = CommTCP
			c.commWhy = "the default with processes on the CPU"
		}
	}
	gpu := launch.GPU(p.Comm)
	switch {
	case !slices.Contains(comms, p.Comm):
		return fmt.Errorf("unknown --comm %q, expected one of %s", p.Comm, strings.Join(comms, ", "))
	case p.Comm == CommLocal && procs:
		return fmt.Errorf("--comm local runs the ranks as goroutines of one process; processes (--nproc %d, or a launcher's) need --comm tcp on the CPU, or nccl, nvshmem or nccl+nvshmem on GPUs", p.NProc)
	case p.Comm == CommLocal && c.Device == "cuda" && !p.Single():
		return fmt.Errorf("layout: a parallel layout (%s) over --comm local runs its ranks as goroutines on the CPU; --device cuda takes one rank, or processes on GPUs: --nproc %d --comm nccl (one GPU per rank) or --comm nvshmem (ranks may share a GPU)", p, p.World)
	case p.Comm == CommTCP && c.Device == "cuda":
		return fmt.Errorf("--comm tcp moves host tensors between CPU ranks; with --device cuda use --comm nccl, nvshmem or nccl+nvshmem")
	case gpu && c.Device == "cpu":
		return fmt.Errorf("--comm %s moves GPU tensors; use --device cuda (or auto), or --comm tcp on the CPU", p.Comm)
	case l.launched && p.World != l.world:
		return fmt.Errorf("layout: the launcher started %d processes, but the layout (%s) has %d ranks: give --dp, --tp (and --world) whose product is %d, or start %d processes", l.world, p, p.World, l.world, p.World)
	case !l.launched && p.NProc > 0 && p.NProc != p.World:
		return fmt.Errorf("layout: --nproc %d starts %d processes, but the layout (%s) has %d ranks: give --dp, --tp (and --world) whose product is %d, or --nproc %d", p.NProc, p.NProc, p, p.World, p.NProc, p.World)
	case !procs && p.Processes() && p.World > 1:
		return fmt.Errorf("--comm %s runs one process per rank: add --nproc %d, or start %d processes with torchrun, srun or mpirun", p.Comm, p.World, p.World)
	}
	if p.Processes() && c.Device == "auto" {
		c.Device = "cpu"
		if gpu {
			c.Device = "cuda"
		}
	}
	return nil
}

// Duration is a time.Duration written in JSON as a string ("5m0s"); a
// number reads as seconds.
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "90s", "5m" or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("comm_timeout: %w", err)
		}
		*d = Duration(v)
		return nil
	}
	var sec float64
	if err := json.Unmarshal(b, &sec); err != nil || math.IsNaN(sec) || math.Abs(sec) > 1e9 {
		return fmt.Errorf("comm_timeout: %s, expected a duration such as \"5m\" or a number of seconds", b)
	}
	*d = Duration(sec * float64(time.Second))
	return nil
}

// runLayout is what a resume must match: the sizes of the run that wrote
// the checkpoints.
type runLayout struct {
	TP, DP, EP int
	SP         bool
	DistOpt    bool // the distributed optimizer
}

func (l runLayout) String() string {
	s := fmt.Sprintf("tp=%d dp=%d ep=%d sequence-parallel=%v", l.TP, l.DP, l.EP, l.SP)
	if l.DistOpt {
		s += " distributed-optimizer"
	}
	if l == (runLayout{1, 1, 1, false, false}) {
		return s + " (a single rank)"
	}
	return fmt.Sprintf("%s (%d ranks)", s, l.TP*l.DP)
}

func (p ParallelConfig) layout() runLayout {
	return runLayout{TP: p.TP, DP: p.DP, EP: p.EP, SP: p.SequenceParallel && !p.Single(), DistOpt: p.DistributedOptimizer && !p.Single()}
}

// checkResume checks, before any work, that --resume names a run this
// run can continue: a parallel run's out dir (rank-00000, rank-00001...)
// or a single-rank checkpoint or out dir, not one rank's checkpoint of a
// parallel run. A run at another layout is resharded (train.RunSharded:
// its checkpoints record their slices) and the start says so, naming both
// layouts; one whose checkpoints are of the older format (no slices)
// resumes at its own layout only. A path holding neither is left to the
// loaders' own errors.
func (c *Config) checkResume() error {
	p, dir := c.Parallel, c.Train.Resume
	want := p.layout()
	got, parallelDir, ranks, err := recordedLayout(dir)
	if err != nil {
		if p.Single() {
			return nil // train reports the missing or broken checkpoint itself
		}
		return fmt.Errorf("resume from %s: expected the out dir of a run (holding %s... for a run of several ranks): %w", dir, train.RankDir(dir, 0), err)
	}
	if !parallelDir && got != singleLayout {
		return fmt.Errorf("resume from %s: one rank's checkpoint of a run at layout %s; --resume takes the run's out dir (the parent of rank-00000)", dir, got)
	}
	if got == want {
		return nil
	}
	if parallelDir && ranks == 0 {
		return fmt.Errorf("resume from %s: the run was trained at layout %s, and its checkpoints, of the older format, record no slices: they resume at that layout only; this run asks for %s: resume with the same --tp, --dp, --ep and --sequence-parallel (or start a new run)", dir, got, want)
	}
	if c.resume != nil {
		c.resume.layout = fmt.Sprintf("the checkpoint's layout %s, this run's %s: every weight and optimizer state resharded", got, want)
	}
	return nil
}

// singleLayout is the layout of a run of one rank.
var singleLayout = runLayout{1, 1, 1, false, false}

// recordedLayout reads the layout of the checkpoints under dir: a parallel
// run's out dir (its rank-00000's latest state.json, and the number of
// ranks it records: 0 for the older format), or a single checkpoint or out
// dir (a state.json without a layout is a single rank).
func recordedLayout(dir string) (l runLayout, parallelDir bool, ranks int, err error) {
	path := dir
	if fi, err := os.Stat(train.RankDir(dir, 0)); err == nil && fi.IsDir() {
		path, parallelDir = train.RankDir(dir, 0), true
	}
	ck, err := train.ResolveCheckpoint(path)
	if err != nil {
		return l, parallelDir, 0, err
	}
	st, err := train.ReadState(ck + string(os.PathSeparator) + train.StateFile)
	if err != nil {
		return l, parallelDir, 0, err
	}
	if len(st.Layout) == 0 {
		return singleLayout, parallelDir, st.Ranks, nil
	}
	var ml model.Layout
	if err := json.Unmarshal(st.Layout, &ml); err != nil {
		return l, parallelDir, 0, fmt.Errorf("%s: layout %s: %w", ck, st.Layout, err)
	}
	return runLayout{TP: ml.TP, DP: ml.DP, EP: ml.EP, SP: ml.SequenceParallel, DistOpt: ml.DistributedOptimizer}, parallelDir, st.Ranks, nil
}
