package nvshmem

import (
	"fmt"
	"os"
	"strings"
)

// Report is what a world runs over, as far as NVSHMEM lets one see: rank 0
// logs it at New (Comm.Report on any rank).
//
// Peers are counted from this rank: P2P peers on the same GPU (several PEs
// per GPU), P2P peers on other GPUs (NVLink or PCIe peer access: NVSHMEM
// does not say which), and the others, reached through NVSHMEM's remote
// transport. For those, RemoteTransport repeats what the environment asks
// for (NVSHMEM_REMOTE_TRANSPORT, "ibrc" by default, and
// NVSHMEM_IB_ENABLE_IBGDA): NVSHMEM has no API that says which transport a
// peer actually uses.
type Report struct {
	Library                  Library
	Rank, Size, Device       int
	DeviceName, PCI, Host    string
	Hosts, GPUs, MaxPEsOnGPU int
	// Mode is NVSHMEM's init status: "one PE per GPU", "limited MPG"
	// (several PEs share a GPU without MPS: NVSHMEM's collectives are off)
	// or "full MPG" (with MPS).
	Mode                      string
	SameGPU, OtherGPU, Remote int
	RemoteTransport           string
	// Path is how the world's collectives run (Comm.Path).
	Path string
}

func (w *world) makeReport() Report {
	me := w.peers[w.rank]
	r := Report{Library: w.lib, Rank: w.rank, Size: w.size, Device: w.dev, DeviceName: me.Name, PCI: me.PCI, Host: me.Host}
	hosts := map[string]bool{}
	gpus := map[string]int{}
	for _, p := range w.peers {
		hosts[p.Host] = true
		gpus[p.Host+"/"+p.PCI]++
	}
	r.Hosts, r.GPUs = len(hosts), len(gpus)
	for _, n := range gpus {
		r.MaxPEsOnGPU = max(r.MaxPEsOnGPU, n)
	}
	switch w.status {
	case statusInitialized:
		r.Mode = "one PE per GPU"
	case statusLimitedMPG:
		r.Mode = "limited MPG"
	case statusFullMPG:
		r.Mode = "full MPG"
	default:
		r.Mode = fmt.Sprintf("init status %d", w.status)
	}
	for q, p := range w.peers {
		switch {
		case q == w.rank:
		case !me.P2P[q]:
			r.Remote++
		case p.Host == me.Host && p.PCI == me.PCI:
			r.SameGPU++
		default:
			r.OtherGPU++
		}
	}
	r.RemoteTransport = "none needed"
	if r.Remote > 0 {
		t := os.Getenv("NVSHMEM_REMOTE_TRANSPORT")
		if t == "" {
			t = "ibrc (default)"
		}
		gda := "IBGDA off"
		if v := os.Getenv("NVSHMEM_IB_ENABLE_IBGDA"); v != "" && v != "0" && !strings.EqualFold(v, "false") {
			gda = "IBGDA requested"
		}
		r.RemoteTransport = fmt.Sprintf("NVSHMEM_REMOTE_TRANSPORT=%s, %s (as configured: NVSHMEM does not report the transport in use)", t, gda)
	}
	all := seqRanks(w.size)
	switch {
	case w.size == 1:
		r.Path = "local"
	case w.teamsAllowed() && w.p2p(all):
		r.Path = "nvshmem team + p2p kernels"
	case w.teamsAllowed():
		r.Path = "nvshmem team"
	case w.p2p(all):
		r.Path = "p2p kernels"
	default:
		r.Path = "none"
	}
	return r
}

// String is the report's one line.
func (r Report) String() string {
	mode := r.Mode
	switch mode {
	case "limited MPG":
		mode += " (no MPS: NVSHMEM collectives off, ops on the P2P exchange kernels)"
	case "full MPG":
		mode += " (MPS)"
	}
	return fmt.Sprintf("nvshmem: world of %d PEs over NVSHMEM %v (UID bootstrap), %s; rank %d on cuda:%d %s [%s] of %s; %d host(s), %d GPU(s), up to %d PEs per GPU: %s; peers of rank %d: %d P2P on the same GPU, %d P2P on other GPUs (NVLink or PCIe), %d remote; remote transport: %s; collectives: %s",
		r.Size, r.Library.NVSHMEM, r.Library.Path, r.Rank, r.Device, r.DeviceName, r.PCI, r.Host,
		r.Hosts, r.GPUs, r.MaxPEsOnGPU, mode, r.Rank, r.SameGPU, r.OtherGPU, r.Remote, r.RemoteTransport, r.Path)
}
