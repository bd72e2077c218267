package rendezvous

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxNodes bounds the number of hosts ExpandNodeList produces (and of nodes in
// a tasks-per-node list), so that a malformed list cannot exhaust memory.
const MaxNodes = 1 << 16

// DefaultPort is the store's port under SLURM when neither MASTER_PORT nor a
// numeric SLURM_JOB_ID is available; otherwise the port is
// slurmPortBase + jobID%slurmPortSpan, the same on every rank and unlikely to
// be shared by two jobs on one node.
const DefaultPort = 29500

const (
	slurmPortBase = 15000
	slurmPortSpan = 15000
)

var (
	slurmTasksVars = []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}
	slurmListVars  = []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}
)

// slurm reads the environment srun gives each task.
func (e env) slurm() (Info, error) {
	n := varNames{source: "slurm", rank: "SLURM_PROCID", world: "SLURM_NTASKS", localRank: "SLURM_LOCALID",
		localWorld: "SLURM_TASKS_PER_NODE", addr: "MASTER_ADDR (or SLURM_JOB_NODELIST)", port: "MASTER_PORT", job: "SLURM_JOB_ID"}
	info := Info{Source: "slurm", JobID: e.str("SLURM_JOB_ID")}
	var err error
	if info.Rank, err = e.required(n, n.rank); err != nil {
		return Info{}, err
	}
	if !e.has("SLURM_NTASKS") && e.has("SLURM_NPROCS") {
		n.world = "SLURM_NPROCS"
	}
	if info.WorldSize, err = e.required(n, n.world); err != nil {
		return Info{}, err
	}
	if info.LocalWorldSize, err = e.slurmLocalWorld(&n, info.WorldSize); err != nil {
		return Info{}, err
	}
	if err = e.locals(&info, n); err != nil {
		return Info{}, err
	}

	info.MasterAddr = e.str("MASTER_ADDR")
	for _, name := range slurmListVars {
		if info.MasterAddr != "" {
			break
		}
		if list := e.str(name); list != "" {
			hosts, err := expandNodeList(list, 1)
			if err != nil {
				return Info{}, fmt.Errorf("rendezvous: slurm environment: %s: %w", name, err)
			}
			info.MasterAddr = hosts[0]
		}
	}

	port, ok, err := e.int("slurm", "MASTER_PORT", 0)
	if err != nil {
		return Info{}, err
	}
	if !ok {
		port = DefaultPort
		if id, err := strconv.ParseUint(info.JobID, 10, 64); err == nil {
			port = slurmPortBase + int(id%slurmPortSpan)
		}
	}
	info.MasterPort = port
	return info, check(info, n)
}

// slurmLocalWorld finds the number of tasks on this node from the first
// tasks-per-node variable set ("4", "4(x2),3"), indexed by SLURM_NODEID when
// the nodes differ. It records the variable used in n.localWorld.
func (e env) slurmLocalWorld(n *varNames, world int) (int, error) {
	for _, name := range slurmTasksVars {
		v := e.str(name)
		if v == "" {
			continue
		}
		n.localWorld = name
		counts, err := parseTasksPerNode(v)
		if err != nil {
			return 0, fmt.Errorf("rendezvous: slurm environment: %s: %w", name, err)
		}
		if len(counts) == 1 {
			return counts[0], nil
		}
		node, ok, err := e.int("slurm", "SLURM_NODEID", 0)
		switch {
		case err != nil:
			return 0, err
		case !ok:
			return 0, fmt.Errorf("rendezvous: slurm environment: %s=%q lists %d nodes, but SLURM_NODEID is not set to say which is this one", name, v, len(counts))
		case node < 0 || node >= len(counts):
			return 0, fmt.Errorf("rendezvous: slurm environment: SLURM_NODEID=%d is out of range for %s=%q (%d nodes)", node, name, v, len(counts))
		}
		return counts[node], nil
	}
	if world == 1 {
		return 1, nil
	}
	return 0, fmt.Errorf("rendezvous: slurm environment: none of %s is set, so the tasks per node are unknown", strings.Join(slurmTasksVars, ", "))
}

// parseTasksPerNode expands SLURM's tasks-per-node form: comma-separated
// counts, each optionally repeated as "count(xN)". "4(x2),3" gives [4 4 3].
func parseTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		count, reps := item, "1"
		if i := strings.IndexByte(item, '('); i >= 0 {
			if !strings.HasPrefix(item[i:], "(x") || !strings.HasSuffix(item, ")") {
				return nil, fmt.Errorf("tasks per node %q: item %q is not COUNT or COUNT(xREPEAT)", s, item)
			}
			count, reps = item[:i], item[i+2:len(item)-1]
		}
		c, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(reps)
		if err1 != nil || err2 != nil || c < 1 || r < 1 {
			return nil, fmt.Errorf("tasks per node %q: item %q is not COUNT or COUNT(xREPEAT) with positive integers", s, item)
		}
		if len(out)+r > MaxNodes {
			return nil, fmt.Errorf("tasks per node %q: more than %d nodes", s, MaxNodes)
		}
		for ; r > 0; r-- {
			out = append(out, c)
		}
	}
	return out, nil
}

// ExpandNodeList expands a SLURM compressed host list such as
// "gpu[001-004,007],login1" into its hosts, in order: gpu001 gpu002 gpu003
// gpu004 gpu007 login1. A range keeps the zero padding of its lower bound, and
// a name may hold several bracket groups ("r[1-2]n[1-2]" gives r1n1 r1n2 r2n1
// r2n2). Lists that expand to more than MaxNodes hosts are an error.
func ExpandNodeList(list string) ([]string, error) {
	hosts, err := expandNodeList(list, MaxNodes+1)
	if err != nil {
		return nil, err
	}
	if len(hosts) > MaxNodes {
		return nil, fmt.Errorf("node list %q expands to more than %d hosts", list, MaxNodes)
	}
	return hosts, nil
}

// nodeRange is lo..hi printed with width digits (zero padded).
type nodeRange struct{ lo, hi, width int }

// nodeSegment is a literal prefix followed by an optional bracket group.
type nodeSegment struct {
	text   string
	ranges []nodeRange // nil: no bracket group
}

// expandNodeList expands list, stopping after limit hosts.
func expandNodeList(list string, limit int) ([]string, error) {
	var out []string
	depth, start := 0, 0
	for i := 0; i <= len(list); i++ {
		if i < len(list) {
			switch list[i] {
			case '[':
				depth++
			case ']':
				depth--
			}
			if depth < 0 || depth > 1 {
				return nil, fmt.Errorf("node list %q: unbalanced or nested brackets at byte %d", list, i)
			}
			if list[i] != ',' || depth != 0 {
				continue
			}
		} else if depth != 0 {
			return nil, fmt.Errorf("node list %q: unterminated bracket", list)
		}
		item := strings.TrimSpace(list[start:i])
		start = i + 1
		if item == "" || len(out) >= limit {
			continue
		}
		segs, err := parseNodeItem(item)
		if err != nil {
			return nil, fmt.Errorf("node list %q: %w", list, err)
		}
		out = appendHosts(out, segs, "", limit)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("node list %q names no host", list)
	}
	return out, nil
}

// parseNodeItem splits one host pattern ("gpu[001-004,007]-ib") into segments.
func parseNodeItem(item string) ([]nodeSegment, error) {
	var segs []nodeSegment
	for item != "" {
		open := strings.IndexByte(item, '[')
		if open < 0 {
			segs = append(segs, nodeSegment{text: item})
			break
		}
		end := strings.IndexByte(item, ']') // brackets are balanced and not nested here
		seg := nodeSegment{text: item[:open]}
		for _, r := range strings.Split(item[open+1:end], ",") {
			lo, hi, dash := strings.Cut(strings.TrimSpace(r), "-")
			if !dash {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a < 0 || b < a || lo[0] == '+' || hi[0] == '+' {
				return nil, fmt.Errorf("range %q in %q is not N or LO-HI with LO <= HI", r, item)
			}
			seg.ranges = append(seg.ranges, nodeRange{lo: a, hi: b, width: len(lo)})
		}
		segs = append(segs, seg)
		item = item[end+1:]
	}
	return segs, nil
}

// appendHosts appends prefix + every expansion of segs to out, up to limit.
func appendHosts(out []string, segs []nodeSegment, prefix string, limit int) []string {
	if len(segs) == 0 {
		return append(out, prefix)
	}
	s := segs[0]
	if s.ranges == nil {
		return appendHosts(out, segs[1:], prefix+s.text, limit)
	}
	for _, r := range s.ranges {
		for v := r.lo; v <= r.hi && len(out) < limit; v++ {
			out = appendHosts(out, segs[1:], fmt.Sprintf("%s%s%0*d", prefix, s.text, r.width, v), limit)
		}
	}
	return out
}
