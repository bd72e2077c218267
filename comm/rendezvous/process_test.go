package rendezvous

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// helperEnv marks a child process started by TestProcesses.
const helperEnv = "ASYNCTP_RENDEZVOUS_TEST_HELPER"

// TestHelperProcess is not a test: it is the body of the child processes of
// TestProcesses, which re-execute the test binary with helperEnv set.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	if err := helperMain(); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// helperMain is one rank of a job: join, share a unique id from rank 0,
// count, meet at a barrier, report.
func helperMain() error {
	info, err := FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, closeFn, err := Join(ctx, info, Options{})
	if err != nil {
		return err
	}
	var uid []byte
	if info.Rank == 0 {
		uid = make([]byte, 128) // the size of an NCCL unique id
		rand.Read(uid)
	}
	uid, err = c.BroadcastBytes(ctx, "nccl/uid", info.Rank, 0, uid)
	if err != nil {
		return err
	}
	if _, err := c.Add(ctx, "joined", 1); err != nil {
		return err
	}
	if err := c.Barrier(ctx, "exchanged", info.WorldSize); err != nil {
		return err
	}
	joined, err := c.Get(ctx, "joined") // every rank counted itself before the barrier
	if err != nil {
		return err
	}
	fmt.Printf("rank=%d world=%d source=%s job=%s joined=%s uid=%x\n",
		info.Rank, info.WorldSize, info.Source, info.JobID, joined, uid)
	if err := c.Barrier(ctx, "done", info.WorldSize); err != nil {
		return err
	}
	return closeFn()
}

// TestProcesses runs a job of real processes on 127.0.0.1 that meet through
// Join with asynctp's launcher variables.
func TestProcesses(t *testing.T) {
	const world = 3
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	job := fmt.Sprintf("test-%d-%d", os.Getpid(), time.Now().UnixNano())
	ctx := testCtx(t, 60*time.Second)

	cmds := make([]*exec.Cmd, world)
	outs := make([]*bytes.Buffer, world)
	for rank := world - 1; rank >= 0; rank-- { // rank 0 last: the others must retry
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"=1",
			"ASYNCTP_RANK="+strconv.Itoa(rank), "ASYNCTP_WORLD_SIZE="+strconv.Itoa(world),
			"ASYNCTP_LOCAL_RANK="+strconv.Itoa(rank), "ASYNCTP_LOCAL_WORLD_SIZE="+strconv.Itoa(world),
			"ASYNCTP_MASTER_ADDR=127.0.0.1", "ASYNCTP_MASTER_PORT="+port, "ASYNCTP_JOB_ID="+job)
		outs[rank] = new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = outs[rank], outs[rank]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[rank] = cmd
		time.Sleep(20 * time.Millisecond)
	}

	line := regexp.MustCompile(`^rank=(\d) world=3 source=asynctp job=(\S+) joined=3 uid=([0-9a-f]{256})\n$`)
	var uid string
	for rank, cmd := range cmds {
		err := cmd.Wait()
		out := outs[rank].String()
		if err != nil {
			t.Errorf("rank %d: %v; output:\n%s", rank, err, out)
			continue
		}
		m := line.FindStringSubmatch(out)
		switch {
		case m == nil:
			t.Errorf("rank %d: output %q does not match %s", rank, out, line)
		case m[1] != strconv.Itoa(rank) || m[2] != job:
			t.Errorf("rank %d: reported rank %s of job %s, want job %s", rank, m[1], m[2], job)
		case uid == "":
			uid = m[3]
		case m[3] != uid:
			t.Errorf("rank %d received uid %s…, rank 0 shared %s…", rank, m[3][:16], uid[:16])
		}
	}
}
