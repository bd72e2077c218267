package main

// The README's two-node recipe, run as printed on two "nodes" of this
// machine: two network namespaces made by the test, joined by a veth pair
// (10.0.0.1 and 10.0.0.2, addresses of the test's own namespaces only).

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// recipe is the README's two-node block: the ```sh block that starts with
// "NODE=0" and runs --comm tcp (README.md first, then docs/usage.md).
func recipe(t *testing.T) string {
	t.Helper()
	block := regexp.MustCompile("(?s)```sh\n(NODE=0[^\n]*\n.*?)```")
	for _, f := range []string{"../../README.md", "../../docs/usage.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, m := range block.FindAllStringSubmatch(string(b), -1) {
			if strings.Contains(m[1], "--comm tcp") {
				return m[1]
			}
		}
	}
	t.Fatal("no two-node recipe (a ```sh block starting with NODE=0, with --comm tcp) in README.md or docs/usage.md")
	return ""
}

// nodes are the two namespaces, each with its own folder (its "disk"),
// holding build/train: this test binary running the command.
type nodes struct {
	ns   [2]string
	dir  [2]string
	link [2]string // the veth ends
}

// makeNodes makes the namespaces and the link, or skips saying why it
// cannot; everything is removed when the test ends, failed or not.
func makeNodes(t *testing.T) *nodes {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the two-node test needs Linux network namespaces")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("the two-node test needs the ip command (iproute2) to make network namespaces")
	}
	run := func(args ...string) error {
		out, err := exec.Command(ip, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	n := &nodes{}
	id := os.Getpid() % 100000
	for i := range 2 {
		n.ns[i] = fmt.Sprintf("atp-%d-node%d", id, i)
		n.link[i] = fmt.Sprintf("atp%dv%d", id, i)
		if err := run("netns", "add", n.ns[i]); err != nil {
			t.Skipf("cannot make network namespaces here (needs root or CAP_SYS_ADMIN): %v", err)
		}
		t.Cleanup(func() { run("netns", "del", n.ns[i]) })
		n.dir[i] = t.TempDir()
		bin := filepath.Join(n.dir[i], "build")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf("#!/bin/sh\nASYNCTP_TRAIN_MAIN=1 exec %q \"$@\"\n", os.Args[0])
		if err := os.WriteFile(filepath.Join(bin, "train"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	steps := [][]string{
		{"link", "add", n.link[0], "netns", n.ns[0], "type", "veth", "peer", "name", n.link[1], "netns", n.ns[1]},
		{"-n", n.ns[0], "addr", "add", "10.0.0.1/24", "dev", n.link[0]},
		{"-n", n.ns[1], "addr", "add", "10.0.0.2/24", "dev", n.link[1]},
	}
	for i := range 2 {
		steps = append(steps, []string{"-n", n.ns[i], "link", "set", "lo", "up"}, []string{"-n", n.ns[i], "link", "set", n.link[i], "up"})
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			t.Skipf("cannot join the namespaces by a veth pair here: %v", err)
		}
	}
	return n
}

// setLink brings node i's end of the link up or down (down: a cut cable;
// the connections across it end with no reset).
func (n *nodes) setLink(t *testing.T, i int, state string) {
	t.Helper()
	if out, err := exec.Command("ip", "-n", n.ns[i], "link", "set", n.link[i], state).CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s: %v: %s", state, err, out)
	}
}

// node is one node's shell running the recipe.
type node struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	end  time.Time
}

// start runs script in node i's namespace and folder, with NODE=i as the
// recipe's first line says, and env added to the environment.
func (n *nodes) start(t *testing.T, i int, script string, env ...string) *node {
	t.Helper()
	script = strings.Replace(script, "NODE=0", fmt.Sprintf("NODE=%d", i), 1)
	cmd := exec.Command("ip", "netns", "exec", n.ns[i], "sh", "-c", script)
	cmd.Dir = n.dir[i]
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	nd := &node{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = nd.out, nd.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-nd.done })
	go func() { cmd.Wait(); nd.end = time.Now(); close(nd.done) }()
	return nd
}

// wait waits for the node's ranks, at most d.
func (nd *node) wait(t *testing.T, name string, d time.Duration) {
	t.Helper()
	select {
	case <-nd.done:
	case <-time.After(d):
		syscall.Kill(-nd.cmd.Process.Pid, syscall.SIGKILL)
		<-nd.done
		t.Fatalf("%s: still running after %v; output:\n%s", name, d, nd.out)
	}
}

// TestTwoNodes runs the README's two-node recipe as printed, on two network
// namespaces: its losses equal --comm local's bit for bit; a rank killed
// makes every rank exit naming it; a cut link makes every rank exit within
// --comm-timeout and a few seconds, each naming the ranks of the other
// node, which it cannot reach.
func TestTwoNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the two-node test starts 4 processes three times")
	}
	script := recipe(t)
	n := makeNodes(t)
	line := regexp.MustCompile(`build/train (.*) --out (\S+) &`).FindStringSubmatch(script)
	if line == nil {
		t.Fatalf("the recipe has no `build/train ... --out DIR &` line:\n%s", script)
	}
	args, outDir := strings.Fields(line[1]), line[2]

	t.Run("losses", func(t *testing.T) {
		a, b := n.start(t, 0, script), n.start(t, 1, script)
		a.wait(t, "node 0", 2*time.Minute)
		b.wait(t, "node 1", 30*time.Second)
		got := metrics(t, filepath.Join(n.dir[0], outDir))
		ref := t.TempDir()
		local := append(slicesWithout(args, "--comm", "tcp"), "--out", ref)
		if msg, code := runMain(t, local...); code != 0 {
			t.Fatalf("%v: exit %d:\n%s", local, code, msg)
		}
		want := metrics(t, ref)
		if len(got) == 0 || len(got) != len(want) {
			t.Fatalf("%d steps over two nodes, %d with --comm local; node 0:\n%s\nnode 1:\n%s", len(got), len(want), a.out, b.out)
		}
		for i := range want {
			if got[i].Loss != want[i].Loss {
				t.Fatalf("step %d: loss %v over two nodes, %v with --comm local (want the same bits)", want[i].Step, got[i].Loss, want[i].Loss)
			}
		}
		// The ranks found the two hosts at the rendezvous: two network
		// namespaces of one kernel are two hosts.
		if !regexp.MustCompile(`(?m)^hosts: 2 \(ranks 0-1 on \S+, ranks 2-3 on \S+\)$`).MatchString(a.out.String()) {
			t.Errorf("rank 0 does not report ranks 0-1 and 2-3 on two hosts; node 0's output:\n%s", a.out)
		}
		t.Logf("%d steps, the same losses as --comm local; node 0's output:\n%s", len(got), a.out)
	})

	t.Run("rank killed", func(t *testing.T) {
		env := "ASYNCTP_FAULT_EXIT_AT_STEP=3:3" // rank 3 (node 1) kills itself after step 3
		script := strings.Replace(script, "--out "+outDir, "--out "+outDir+"-kill", 1)
		a, b := n.start(t, 0, script, env), n.start(t, 1, script, env)
		a.wait(t, "node 0", time.Minute)
		b.wait(t, "node 1", 30*time.Second)
		all := a.out.String() + b.out.String()
		for _, r := range []int{0, 1, 2} {
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^train: rank %d: .*world rank 3 is gone`, r)).MatchString(all) {
				t.Errorf("rank %d does not say that rank 3 is gone; output:\n%s", r, all)
			}
		}
	})

	t.Run("link cut", func(t *testing.T) {
		const timeout = 3 * time.Second
		script := strings.Replace(script, "--out "+outDir, fmt.Sprintf("--out %s-cut --steps 100000 --log-every 1 --comm-timeout %v", outDir, timeout), 1)
		a, b := n.start(t, 0, script), n.start(t, 1, script)
		defer n.setLink(t, 1, "up")
		started := time.Now()
		for !regexp.MustCompile(`step +5/`).MatchString(a.out.String()) {
			if time.Since(started) > time.Minute {
				t.Fatalf("no step 5 within a minute; node 0:\n%s\nnode 1:\n%s", a.out, b.out)
			}
			time.Sleep(50 * time.Millisecond)
		}
		n.setLink(t, 1, "down")
		cut := time.Now()
		bound := timeout + 5*time.Second
		a.wait(t, "node 0", time.Minute)
		b.wait(t, "node 1", time.Minute)
		for i, nd := range []*node{a, b} {
			if d := nd.end.Sub(cut); d > bound {
				t.Errorf("node %d's ranks ended %v after the cut, want within --comm-timeout %v + 5s", i, d.Round(time.Millisecond), timeout)
			} else {
				t.Logf("node %d's ranks ended %v after the cut", i, d.Round(time.Millisecond))
			}
		}
		// Every rank of both nodes names the other node's ranks, and says
		// so when it happens (its line is there within the bound, whatever
		// it does next).
		for r, lost := range map[int]string{0: "2, 3", 1: "2, 3", 2: "0, 1", 3: "0, 1"} {
			nd := a
			if r >= 2 {
				nd = b
			}
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^(train: )?rank %d: .*(world ranks %s are unreachable|unreachable: world ranks %s )`, r, lost, lost))
			at, ok := nd.out.FirstMatch(re)
			switch {
			case !ok:
				t.Errorf("rank %d does not name ranks %s as unreachable; node %d's output:\n%s", r, lost, r/2, nd.out)
			case at.Sub(cut) > bound:
				t.Errorf("rank %d named ranks %s %v after the cut, want within --comm-timeout %v + 5s", r, lost, at.Sub(cut).Round(time.Millisecond), timeout)
			default:
				t.Logf("rank %d named ranks %s %v after the cut", r, lost, at.Sub(cut).Round(time.Millisecond))
			}
		}
	})
}

// slicesWithout returns args without the pair (flag, value).
func slicesWithout(args []string, flag, value string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag && i+1 < len(args) && args[i+1] == value {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads, which
// remembers when each write came.
type syncBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes []stampedWrite
}

type stampedWrite struct {
	end int // the buffer's length after the write
	at  time.Time
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	s.writes = append(s.writes, stampedWrite{s.b.Len(), time.Now()})
	return n, err
}

// FirstMatch returns when the first match of re was written (the time of
// the write that completed it), and whether there is one.
func (s *syncBuffer) FirstMatch(re *regexp.Regexp) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	loc := re.FindIndex(s.b.Bytes())
	if loc == nil {
		return time.Time{}, false
	}
	for _, w := range s.writes {
		if w.end >= loc[1] {
			return w.at, true
		}
	}
	return time.Time{}, false
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
