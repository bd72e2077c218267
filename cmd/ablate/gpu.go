package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynctp/asynctp/ablate"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/launch"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The process cells: a batch of one (transport, world) runs as world child
// processes of this binary, one rank each, meeting through a rendezvous
// store that rank 0 hosts. On the GPU each is an NVSHMEM PE or NCCL rank,
// rank r on GPU r % GPUs (NVSHMEM PEs share a GPU, under MPS when it
// runs); over tcp each is a CPU rank (one thread) of comm/tcp.

const (
	batchEnv   = "ASYNCTP_ABLATE_BATCH" // the child's batch file
	resultLine = "ablate-result "       // rank 0's result lines on stdout
	reportLine = "ablate-transport "    // rank 0's NVSHMEM transport report
)

type gpuInfo struct {
	count int
	name  string // GPU 0's name, "cpu" without one
	why   string // why there is no usable GPU
}

// probeGPU finds the GPUs the GPU cells can use (the driver, a device, the
// kernels image) and fills the environment's GPU library versions.
func probeGPU(env *ablate.Env) gpuInfo {
	g := gpuInfo{name: "cpu"}
	if l, err := launch.Library(launch.NCCL); err == nil {
		env.NCCL = l
	} else {
		env.NCCL = "none: " + err.Error()
	}
	if l, err := launch.Library(launch.NVSHMEM); err == nil {
		env.NVSHMEM = l
	} else {
		env.NVSHMEM = "none: " + err.Error()
	}
	if err := cuda.Init(); err != nil {
		g.why = fmt.Sprintf("no CUDA driver (%v)", err)
		return g
	}
	if v, err := cuda.DriverVersion(); err == nil {
		env.CUDA = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n, err := cuda.DeviceCount()
	if err != nil || n == 0 {
		g.why = fmt.Sprintf("no CUDA device (%v)", err)
		return g
	}
	if _, err := cudabackend.FindKernels(); err != nil {
		g.why = fmt.Sprintf("no kernels image (%v)", err)
		return g
	}
	b, err := cudabackend.New(0)
	if err != nil {
		g.why = fmt.Sprintf("GPU 0: %v", err)
		return g
	}
	g.name = b.DeviceName()
	b.Close()
	g.count = n
	return g
}

// batchFile is what a child reads.
type batchFile struct {
	Transport string        `json:"transport"`
	Cells     []ablate.Cell `json:"cells"`
	Warmup    int           `json:"warmup"`
	Reps      int           `json:"reps"`
	Seed      uint64        `json:"seed"`
	Timeout   string        `json:"timeout"`
	// FusedTransfer is the fused strategy's transfer (peercopy.Engine).
	FusedTransfer string `json:"fused_transfer,omitempty"`
}

// runProcs runs one batch as world child processes and returns rank 0's
// results as they arrive (done sees each).
func runProcs(ctx context.Context, transport string, world int, cells []ablate.Cell, m ablate.Matrix, o options, g gpuInfo,
	env *ablate.Env, done func(ablate.Result)) ([]ablate.Result, error) {
	switch transport {
	case launch.NVSHMEM, launch.NCCL, launch.Hybrid:
		if _, err := launch.Library(transport); err != nil {
			return nil, err
		}
	case launch.TCP:
	default:
		return nil, fmt.Errorf("transport %q: expected tcp, nvshmem or nccl for a batch of processes", transport)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "ablate-batch-*.json")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	js, _ := json.Marshal(batchFile{Transport: transport, Cells: cells, Warmup: m.Warmup, Reps: m.Reps, Seed: o.seed, Timeout: o.timeout.String(),
		FusedTransfer: o.fusedTransfer})
	f.Write(js)
	f.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port for the store (rank 0 hosts it)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	job := fmt.Sprintf("ablate-%s-%d-%d", transport, world, time.Now().UnixNano())
	var results []ablate.Result
	var mu sync.Mutex
	cmds := make([]*exec.Cmd, world)
	tails := make([]*bytes.Buffer, world)
	var readers sync.WaitGroup
	for r := range world {
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), batchEnv+"="+f.Name(),
			"ASYNCTP_RANK="+strconv.Itoa(r), "ASYNCTP_WORLD_SIZE="+strconv.Itoa(world),
			"ASYNCTP_LOCAL_RANK="+strconv.Itoa(r), "ASYNCTP_LOCAL_WORLD_SIZE="+strconv.Itoa(world),
			"ASYNCTP_MASTER_ADDR=127.0.0.1", "ASYNCTP_MASTER_PORT="+port, "ASYNCTP_JOB_ID="+job)
		if transport != "tcp" && g.count > 0 {
			cmd.Env = append(cmd.Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(100/max(1, (world+g.count-1)/g.count)))
		}
		cmd.Env = append(cmd.Env, launch.ChildVars...) // NVLink multicast off, as cmd/train's ranks have it
		tails[r] = new(bytes.Buffer)
		cmd.Stderr = tails[r]
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			for _, c := range cmds[:r] {
				c.Process.Kill()
				c.Wait()
			}
			return nil, fmt.Errorf("starting rank %d of %d: %w", r, world, err)
		}
		cmds[r] = cmd
		readers.Add(1)
		go func(r int, out io.Reader) {
			defer readers.Done()
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 1<<20), 1<<24)
			for sc.Scan() {
				l := sc.Text()
				switch {
				case r == 0 && strings.HasPrefix(l, resultLine):
					var res ablate.Result
					if json.Unmarshal([]byte(l[len(resultLine):]), &res) == nil {
						mu.Lock()
						results = append(results, res)
						mu.Unlock()
						done(res)
					}
				case r == 0 && strings.HasPrefix(l, reportLine):
					mu.Lock()
					env.Transport[fmt.Sprintf("%s world %d", transport, world)] = strings.ReplaceAll(l[len(reportLine):], "\\n", "\n")
					mu.Unlock()
				default:
					mu.Lock()
					fmt.Fprintln(tails[r], l)
					mu.Unlock()
				}
			}
		}(r, out)
	}
	readers.Wait()
	var errs []string
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			mu.Lock()
			t := strings.TrimSpace(tails[r].String())
			mu.Unlock()
			if len(t) > 1500 {
				t = "…" + t[len(t)-1500:]
			}
			errs = append(errs, fmt.Sprintf("rank %d: %v: %s", r, err, t))
		}
	}
	if len(errs) > 0 {
		return results, fmt.Errorf("%s world %d: %s", transport, world, strings.Join(errs, "; "))
	}
	return results, nil
}

// child is one rank of a batch of processes: it prints rank 0's results on
// stdout.
func child() int {
	if err := childRun(); err != nil {
		fmt.Fprintln(os.Stderr, "ablate child:", err)
		return 1
	}
	return 0
}

func childRun() error {
	js, err := os.ReadFile(os.Getenv(batchEnv))
	if err != nil {
		return err
	}
	var bf batchFile
	if err := json.Unmarshal(js, &bf); err != nil {
		return fmt.Errorf("batch %s: %v", os.Getenv(batchEnv), err)
	}
	timeout, err := time.ParseDuration(bf.Timeout)
	if err != nil {
		return err
	}
	info, err := rendezvous.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	o := launch.Options{Transport: bf.Transport, Timeout: timeout,
		CPU: func(int, int) (tensor.Backend, error) { return cpu.New(cpu.WithThreads(1)), nil }}
	w, err := launch.Open(ctx, info, o)
	if err != nil {
		return err
	}
	defer w.Close()
	if bf.Transport == launch.TCP {
		// A single-threaded CPU rank, as the goroutine ranks of local are.
		r := &ablate.Rank{Group: w.Comm, Backend: w.Backend, Timer: ablate.WallTimer{Backend: w.Backend}, Strategies: cpuStrategies(),
			Seed: bf.Seed, Warmup: bf.Warmup, Reps: bf.Reps, Collectives: launch.TCP}
		return runRank(ctx, r, bf, info, w.Store)
	}
	b, ok := w.Backend.(*cudabackend.Backend)
	if !ok || w.Stream == nil {
		return fmt.Errorf("transport %s: backend %T without a stream: expected the CUDA backend and its stream to order the collectives on", bf.Transport, w.Backend)
	}
	// The fused strategy is in every GPU batch: where it cannot run (nccl,
	// f32, a site kind without a fused form, a GPU without the engine) its
	// Supports says why, and the cell is listed with that reason.
	// One type per name (overlap/strategies): each picks its form from the
	// cell's group, so a hybrid world's collective cells run on NCCL and its
	// pipelined and fused cells on NVSHMEM's symmetric memory (Result.Via).
	byName := ablate.Registry(strategies.Options{Transfer: bf.FusedTransfer})
	coll, sym := bf.Transport, ""
	switch bf.Transport {
	case launch.NVSHMEM:
		sym = launch.NVSHMEM
	case launch.Hybrid:
		coll, sym = launch.NCCL, launch.NVSHMEM
	}
	if info.Rank == 0 && w.Report != "" {
		fmt.Println(reportLine + strings.ReplaceAll(w.Report, "\n", "\\n"))
	}
	r := &ablate.Rank{Group: w.Comm, Backend: b, Stream: w.Stream, Timer: eventTimer{b}, Strategies: byName, Seed: bf.Seed, Warmup: bf.Warmup, Reps: bf.Reps,
		Engine: engineMatMul(b), Collectives: coll, Symmetric: sym}
	return runRank(ctx, r, bf, info, w.Store)
}

// engineMatMul is the fused strategy's GEMM engine (no hooks) as an
// ablate.MatMulFunc, or nil where the GPU cannot run it; a call the engine
// cannot run is refused before anything is queued (an error of the engine
// itself would stick to the backend).
func engineMatMul(b *cudabackend.Backend) ablate.MatMulFunc {
	if b.EngineErr() != nil {
		return nil
	}
	return func(c, a, bm *tensor.Tensor, transA, transB bool, alpha, beta float32) error {
		if err := b.EngineSupports(c, a, bm, transA, transB); err != nil {
			return err
		}
		return b.EngineMatMul(c, a, bm, transA, transB, alpha, beta, cudabackend.GEMMOptions{})
	}
}

// runRank runs the batch's cells on this rank, rank 0 printing each
// result, and waits for the other ranks at the end.
func runRank(ctx context.Context, r *ablate.Rank, bf batchFile, info rendezvous.Info, store *rendezvous.Client) error {
	if info.Rank == 0 {
		r.Done = func(res ablate.Result) {
			js, _ := json.Marshal(res)
			fmt.Println(resultLine + string(js))
		}
	}
	_, err := r.Run(bf.Cells)
	if err == nil {
		err = r.Backend.Sync()
	}
	if e := store.Barrier(ctx, "ablate-done", info.WorldSize); err == nil {
		err = e
	}
	return err
}

// eventTimer times with CUDA events on the backend's stream.
type eventTimer struct{ b *cudabackend.Backend }

func (t eventTimer) Time(fn func() error) (time.Duration, error) { return t.b.TimeEvents(fn) }
