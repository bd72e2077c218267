package commtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Processes says how RunProcesses starts the ranks of a multi-process test:
// the test binary, re-executed once per rank, runs the test Test, which does
// its rank's part when Env marks it as a child (and skips otherwise).
type Processes struct {
	N       int           // ranks, one process each
	Test    string        // the test the children run: "TestChild"
	Job     string        // the job id's prefix, "tcp-suite": the pid and the time follow
	Timeout time.Duration // for all of them, also each child's -test.timeout
	// Env returns the extra environment variables of rank r, which follow
	// os.Environ() and the launcher variables (ASYNCTP_RANK, _WORLD_SIZE,
	// _LOCAL_RANK, _LOCAL_WORLD_SIZE, _MASTER_ADDR, _MASTER_PORT, _JOB_ID)
	// that comm/rendezvous reads. Nil: none.
	Env func(r int) []string
}

// Process is the outcome of one child process.
type Process struct {
	Rank int
	Out  string // its stdout and stderr
	Err  error  // from Wait: nil when it exited with 0
}

// Code is the exit code: 0 when it succeeded, -1 when it did not exit.
func (p Process) Code() int {
	var ee *exec.ExitError
	if errors.As(p.Err, &ee) {
		return ee.ExitCode()
	}
	if p.Err != nil {
		return -1
	}
	return 0
}

// EnvWrap is a command that RunProcesses puts in front of every child,
// split at spaces, {rank} replaced by the child's rank: as mpirun runs
// `compute-sanitizer ./app` per rank, e.g.
// ASYNCTP_PE_WRAP="compute-sanitizer --tool memcheck --log-file /tmp/san-{rank}.txt".
// A tool around the whole test binary would instead watch the parent too,
// and its children through one tool process.
const EnvWrap = "ASYNCTP_PE_WRAP"

// EnvLogDir is a folder where RunProcesses also writes each child's output
// as it comes (<job>-rank<r>.log): what a child printed is kept even when
// the parent is killed before it can report it.
const EnvLogDir = "ASYNCTP_PE_LOG_DIR"

// RunProcesses starts p.N children that meet through comm/rendezvous at a
// store on 127.0.0.1 (a free port) and waits for all of them (at most
// p.Timeout). Failing to start one fails tb at once; the outcomes, by rank,
// are for the caller to judge. $ASYNCTP_PE_WRAP and $ASYNCTP_PE_LOG_DIR
// (EnvWrap, EnvLogDir) wrap the children in a tool and keep their output.
func RunProcesses(tb testing.TB, p Processes) []Process {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port for the store
	if err != nil {
		tb.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	job := fmt.Sprintf("%s-%d-%d", p.Job, os.Getpid(), time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	n := p.N
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	wrap := strings.Fields(os.Getenv(EnvWrap))
	logDir := os.Getenv(EnvLogDir)
	for r := range n {
		args := []string{os.Args[0], "-test.run=^" + p.Test + "$", "-test.count=1", "-test.v",
			"-test.timeout=" + p.Timeout.String()}
		if len(wrap) > 0 {
			w := make([]string, len(wrap))
			for i, f := range wrap {
				w[i] = strings.ReplaceAll(f, "{rank}", strconv.Itoa(r))
			}
			args = append(w, args...)
		}
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(),
			"ASYNCTP_RANK="+strconv.Itoa(r), "ASYNCTP_WORLD_SIZE="+strconv.Itoa(n),
			"ASYNCTP_LOCAL_RANK="+strconv.Itoa(r), "ASYNCTP_LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"ASYNCTP_MASTER_ADDR=127.0.0.1", "ASYNCTP_MASTER_PORT="+port, "ASYNCTP_JOB_ID="+job)
		if p.Env != nil {
			cmd.Env = append(cmd.Env, p.Env(r)...)
		}
		outs[r] = new(bytes.Buffer)
		var out io.Writer = outs[r]
		if logDir != "" {
			f, err := os.Create(filepath.Join(logDir, fmt.Sprintf("%s-rank%d.log", job, r)))
			if err != nil {
				tb.Fatalf("%s: %v", EnvLogDir, err)
			}
			defer f.Close()
			out = io.MultiWriter(outs[r], f)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			tb.Fatalf("starting rank %d: %v", r, err)
		}
		cmds[r] = cmd
	}
	res := make([]Process, n)
	for r, cmd := range cmds {
		err := cmd.Wait()
		res[r] = Process{Rank: r, Out: outs[r].String(), Err: err}
	}
	return res
}
