package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/asynctp/asynctp/comm/rendezvous"
)

// KillAfter is how long Spawn waits after SIGTERM before SIGKILL.
const KillAfter = 5 * time.Second

// StopGrace is how long, after a rank fails or the launcher is
// interrupted, Spawn lets the other ranks notice and exit on their own
// before it stops them (SIGTERM, then SIGKILL): the collective deadline
// timeout, between 5 and 30 seconds.
func StopGrace(timeout time.Duration) time.Duration {
	return min(max(timeout, 5*time.Second), 30*time.Second)
}

// ChildVars are set in every rank's environment, whatever the launcher's
// own: NVLink multicast stays off (NCCL's NVLS, NVSHMEM's, PyTorch's
// symmetric memory's), since it can take a host's GPUs out of service.
var ChildVars = []string{"NCCL_NVLS_ENABLE=0", "NVSHMEM_DISABLE_NVLS=1", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1"}

// SpawnConfig is what Spawn starts.
type SpawnConfig struct {
	// N processes of Command (the executable and its arguments).
	N       int
	Command []string
	// Transport is the ranks' (for the start line and Preflight).
	Transport string
	// Timeout is the ranks' collective deadline (StopGrace).
	Timeout time.Duration
	// Stdout and Stderr receive the ranks' output (os.Stdout, os.Stderr
	// when nil): rank 0's as it is, the others' lines prefixed "[rank k] ".
	Stdout, Stderr io.Writer
	// Second carries the second and later interrupts of the launcher: each
	// is passed on to the ranks (which stop at once). The first is ctx's
	// cancellation.
	Second <-chan os.Signal
}

// rankProc is one process started by the launcher.
type rankProc struct {
	rank  int
	cmd   *exec.Cmd
	last  *lastLine // its last line on stderr
	err   error     // from Wait
	ended time.Time
	done  bool
	stop  string // how the launcher stopped it, if it did
}

// Spawn is --nproc N's launcher: it hosts the job's store on 127.0.0.1,
// starts N processes of c.Command, rank r with
// ASYNCTP_RANK=r (see rendezvous.FromEnv) and ASYNCTP_STORE=launcher, and
// waits for them. Rank 0's output passes through; the others' lines are
// prefixed "[rank k] ". When a rank fails or dies, the others are given
// stopGrace to notice it (their transport names the lost rank) and exit;
// those still running then are stopped (SIGTERM, then SIGKILL after
// KillAfter). An interrupt of the launcher is passed on as SIGTERM (the
// ranks stop at the same step and write a checkpoint). The error names the
// rank that failed first and how, then what became of the others.
func Spawn(ctx context.Context, c SpawnConfig) error {
	n := c.N
	if n < 1 || len(c.Command) == 0 {
		return fmt.Errorf("--nproc %d of %q: expected at least one process of a command", n, c.Command)
	}
	if err := Preflight(c.Transport, n); err != nil {
		return err
	}
	stdout, stderr := c.Stdout, c.Stderr
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}
	grace := StopGrace(c.Timeout)
	exe, args := c.Command[0], c.Command[1:]
	var id [6]byte
	rand.Read(id[:])
	job := "train-" + hex.EncodeToString(id[:])
	srv, err := rendezvous.Serve(ctx, "127.0.0.1:0", job)
	if err != nil {
		return fmt.Errorf("--nproc: %w", err)
	}
	defer srv.Close()
	srv.SetWorld(n)
	_, port, _ := net.SplitHostPort(srv.Addr())
	fmt.Fprintf(stdout, "launcher: %d processes of %s, --comm %s, store %s, job %s\n", n, exe, c.Transport, srv.Addr(), job)

	var outMu sync.Mutex // the ranks' lines, whole
	var pids []string
	procs := make([]*rankProc, n)
	ended := make(chan *rankProc, n)
	start := time.Now()
	for r := range n {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(),
			"ASYNCTP_RANK="+strconv.Itoa(r), "ASYNCTP_WORLD_SIZE="+strconv.Itoa(n),
			"ASYNCTP_LOCAL_RANK="+strconv.Itoa(r), "ASYNCTP_LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"ASYNCTP_MASTER_ADDR=127.0.0.1", "ASYNCTP_MASTER_PORT="+port, "ASYNCTP_JOB_ID="+job,
			EnvStore+"=launcher")
		cmd.Env = append(cmd.Env, ChildVars...)
		pr := &rankProc{rank: r, cmd: cmd, last: &lastLine{}}
		if r == 0 {
			cmd.Stdout = stdout
			cmd.Stderr = io.MultiWriter(stderr, pr.last)
		} else {
			prefix := fmt.Sprintf("[rank %d] ", r)
			cmd.Stdout = &prefixWriter{prefix: prefix, dst: stdout, mu: &outMu}
			cmd.Stderr = io.MultiWriter(&prefixWriter{prefix: prefix, dst: stderr, mu: &outMu}, pr.last)
		}
		setProcAttr(cmd)
		if err := cmd.Start(); err != nil {
			for _, q := range procs[:r] {
				q.cmd.Process.Kill()
				q.cmd.Wait()
			}
			return fmt.Errorf("--nproc: starting rank %d: %w", r, err)
		}
		procs[r] = pr
		pids = append(pids, strconv.Itoa(cmd.Process.Pid))
		go func() {
			pr.err = cmd.Wait()
			pr.ended = time.Now()
			ended <- pr
		}()
	}

	fmt.Fprintf(stdout, "launcher: ranks 0 to %d are pids %s\n", n-1, strings.Join(pids, " "))
	var first *rankProc // the first rank to fail
	var graceC, kill <-chan time.Time
	interrupted := false
	signalAll := func(sig syscall.Signal, how string) {
		for _, q := range procs {
			if !q.done {
				q.stop = how
				q.cmd.Process.Signal(sig)
			}
		}
	}
	for left := n; left > 0; {
		select {
		case pr := <-ended:
			pr.done = true
			left--
			if pr.err != nil && first == nil && !interrupted {
				first = pr
				if left > 0 {
					fmt.Fprintf(stderr, "launcher: rank %d %s; the other ranks have %v to stop\n", pr.rank, describeExit(pr.err), grace)
					graceC = time.After(grace)
				}
			}
		case <-ctx.Done():
			if !interrupted {
				interrupted = true
				signalAll(syscall.SIGTERM, "passed on the interrupt (SIGTERM)")
				graceC = time.After(grace)
			}
		case <-c.Second:
			// The ranks had the first as SIGTERM: a second makes them stop at once.
			signalAll(syscall.SIGTERM, "passed on the second interrupt (SIGTERM): stopped at once")
			interrupted = true
			kill = time.After(KillAfter)
		case <-graceC:
			graceC = nil
			signalAll(syscall.SIGTERM, fmt.Sprintf("stopped by the launcher (SIGTERM) %v after the first failure", grace))
			kill = time.After(KillAfter)
		case <-kill:
			kill = nil
			signalAll(syscall.SIGKILL, fmt.Sprintf("killed by the launcher (SIGKILL) %v after SIGTERM", KillAfter))
		}
	}
	if first == nil && !interrupted {
		return nil
	}
	var b strings.Builder
	for _, q := range procs {
		if q == first {
			continue
		}
		fmt.Fprintf(&b, "\n  rank %d: ", q.rank)
		switch {
		case q.err == nil:
			b.WriteString("finished")
		case q.stop != "":
			fmt.Fprintf(&b, "%s (%s)", q.stop, describeExit(q.err))
		default:
			fmt.Fprintf(&b, "%s on its own", describeExit(q.err))
			if first != nil {
				fmt.Fprintf(&b, " %v after rank %d", q.ended.Sub(first.ended).Round(time.Millisecond), first.rank)
			}
		}
		if l := q.last.String(); l != "" && q.err != nil {
			fmt.Fprintf(&b, ": %s", l)
		}
	}
	if first == nil {
		return fmt.Errorf("--nproc %d: %w%s", n, context.Cause(ctx), b.String())
	}
	head := fmt.Sprintf("--nproc %d: rank %d %s %v into the run", n, first.rank, describeExit(first.err), first.ended.Sub(start).Round(time.Millisecond))
	if l := first.last.String(); l != "" {
		head += ": " + l
	}
	return errors.New(head + b.String())
}

// describeExit says how a process ended.
func describeExit(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by signal " + ws.Signal().String()
		}
		return "exited with status " + strconv.Itoa(ee.ExitCode())
	}
	return fmt.Sprint(err)
}

// prefixWriter writes whole lines to dst, each after prefix.
type prefixWriter struct {
	prefix string
	dst    io.Writer
	mu     *sync.Mutex
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := w.buf[:i+1]
		// A progress bar redraws with \r: keep its last state only.
		if j := bytes.LastIndexByte(line[:i], '\r'); j >= 0 {
			line = line[j+1:]
		}
		w.mu.Lock()
		w.dst.Write(append([]byte(w.prefix), line...))
		w.mu.Unlock()
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// lastLine keeps the last non-empty line written to it.
type lastLine struct {
	mu   sync.Mutex
	buf  []byte
	line string
}

func (l *lastLine) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		if s := strings.TrimSpace(string(l.buf[:i])); s != "" {
			l.line = s
		}
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 64<<10 {
		l.buf = l.buf[len(l.buf)-(64<<10):]
	}
	return len(p), nil
}

func (l *lastLine) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := strings.TrimSpace(string(l.buf)); s != "" {
		return s
	}
	return l.line
}
