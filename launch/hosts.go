package launch

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
)

// EnvHostID overrides this process's host identity (HostID): ranks that
// give equal values are one host to the world, ranks that give different
// ones are different hosts.
const EnvHostID = "ASYNCTP_HOST_ID"

// HostID is this process's host identity, which the ranks exchange at the
// rendezvous to learn which of them share a host: $ASYNCTP_HOST_ID when
// set; else the host name, the kernel's boot id and the network namespace
// (as NCCL tells hosts apart by name and boot id). Two network namespaces
// of one kernel are two hosts: their ranks reach each other only through
// their interfaces, as two machines' do (the two-node test runs two
// "nodes" so), and a run in separate containers keeps its collectives
// between them.
func HostID(getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	if id := getenv(EnvHostID); id != "" {
		return id
	}
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "localhost"
	}
	id := name
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		id += "|" + strings.TrimSpace(string(b))
	}
	if ns, err := os.Readlink("/proc/self/ns/net"); err == nil {
		id += "|" + ns
	}
	return id
}

// hostKey is the store's key of world rank r's host identity.
func hostKey(r int) string { return fmt.Sprintf("launch/host/%d", r) }

// placeHosts tells the store this rank's host identity and reads every
// rank's (w.Hosts, w.HostNames); a world of one process is one host.
func placeHosts(ctx context.Context, w *World, getenv func(string) string) error {
	me := HostID(getenv)
	ids := []string{me}
	if w.Store != nil {
		if err := w.Store.Set(ctx, hostKey(w.Info.Rank), []byte(me)); err != nil {
			return fmt.Errorf("telling the others this rank's host: %w", err)
		}
		ids = make([]string, w.Info.WorldSize)
		for r := range ids {
			b, err := w.Store.Get(ctx, hostKey(r))
			if err != nil {
				return fmt.Errorf("reading rank %d's host: %w", r, err)
			}
			ids[r] = string(b)
		}
	}
	w.Hosts, w.HostNames = hostsOf(ids)
	return nil
}

// hostsOf numbers the hosts of ids (each world rank's identity) in the
// order of their first rank, and names each: the host name part of its
// identity, made unique with "#2", "#3"... where two identities share it
// (network namespaces of one machine).
func hostsOf(ids []string) (hosts []int, names []string) {
	index := map[string]int{}
	hosts = make([]int, len(ids))
	for r, id := range ids {
		h, ok := index[id]
		if !ok {
			h = len(names)
			index[id] = h
			name, _, _ := strings.Cut(id, "|")
			if name == "" {
				name = "host"
			}
			base, k := name, 1
			for slices.Contains(names, name) {
				k++
				name = fmt.Sprintf("%s#%d", base, k)
			}
			names = append(names, name)
		}
		hosts[r] = h
	}
	return hosts, names
}

// LocalRanks returns the world ranks on this rank's host (its own
// included), in order.
func (w *World) LocalRanks() []int {
	if len(w.Hosts) == 0 {
		return nil
	}
	return w.ranksOn(w.Hosts[w.Info.Rank])
}

// ranksOn returns the world ranks on host h, in order.
func (w *World) ranksOn(h int) []int {
	var out []int
	for r, x := range w.Hosts {
		if x == h {
			out = append(out, r)
		}
	}
	return out
}

// HostSummary says how many hosts the ranks run on and which, for the
// start-up report: "1 (node-a)" or "2 (ranks 0-1 on node-a, ranks 2-3 on
// node-b)", with
// a note where the launcher counts another number of ranks on this rank's
// node than the host identities give.
func (w *World) HostSummary() string {
	if len(w.HostNames) == 0 {
		return ""
	}
	if len(w.HostNames) == 1 {
		return fmt.Sprintf("1 (%s)", w.HostNames[0])
	}
	parts := make([]string, len(w.HostNames))
	for h, name := range w.HostNames {
		rs := w.ranksOn(h)
		unit := "ranks"
		if len(rs) == 1 {
			unit = "rank"
		}
		parts[h] = fmt.Sprintf("%s %s on %s", unit, rankRanges(rs), name)
	}
	s := fmt.Sprintf("%d (%s)", len(w.HostNames), strings.Join(parts, ", "))
	if n, l := len(w.LocalRanks()), w.Info.LocalWorldSize; l > 0 && n != l {
		s += fmt.Sprintf(" (the launcher counts %d ranks on this rank's node, the host identities %d: $%s sets a rank's)", l, n, EnvHostID)
	}
	return s
}

// rankRanges writes sorted ranks as ranges: "0-3, 6, 8-9".
func rankRanges(rs []int) string {
	var parts []string
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", rs[i], rs[j]))
		} else {
			parts = append(parts, fmt.Sprint(rs[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}
