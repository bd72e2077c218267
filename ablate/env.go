package ablate

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Env is the environment of a run, as far as this machine lets one see.
type Env struct {
	Go        string            `json:"go"`
	OS        string            `json:"os"`
	CPUs      int               `json:"cpus"`
	Host      string            `json:"host"`
	GPU       string            `json:"gpu,omitempty"`       // nvidia-smi: name, driver, memory
	CUDA      string            `json:"cuda,omitempty"`      // the driver's CUDA version
	NCCL      string            `json:"nccl,omitempty"`      // the NCCL library found (or why none)
	NVSHMEM   string            `json:"nvshmem,omitempty"`   // the NVSHMEM transport library (or why none)
	Transport map[string]string `json:"transport,omitempty"` // world → the NVSHMEM transport report of rank 0
	Topology  string            `json:"topology,omitempty"`  // nvidia-smi topo -m
	MPS       string            `json:"mps,omitempty"`
	Torch     string            `json:"torch,omitempty"`
	// FusedTransfer is the fused cells' all-gather transfer (pull or put:
	// cmd/ablate --fused-transfer, peercopy.Engine.Transfer).
	FusedTransfer string `json:"fused_transfer,omitempty"`
}

// BaseEnv is what the host says without a GPU library: Go, OS, CPUs, and
// nvidia-smi's answers when it is on PATH.
func BaseEnv() Env {
	h, _ := os.Hostname()
	e := Env{Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, CPUs: runtime.NumCPU(), Host: h, Transport: map[string]string{}}
	if out, err := command("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"); err == nil {
		e.GPU = strings.TrimSpace(out)
		if topo, err := command("nvidia-smi", "topo", "-m"); err == nil {
			e.Topology = strings.TrimRight(topo, "\n")
		}
	}
	if d := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"); d != "" {
		e.MPS = "CUDA_MPS_PIPE_DIRECTORY=" + d
	}
	return e
}

func command(name string, args ...string) (string, error) {
	if _, err := exec.LookPath(name); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return string(out), err
}

// rows are the environment as a table.
func (e Env) rows() [][]string {
	r := [][]string{{"Go", e.Go}, {"OS", e.OS}, {"CPUs", fmt.Sprint(e.CPUs)}, {"host", e.Host}}
	add := func(k, v string) {
		if v != "" {
			r = append(r, []string{k, v})
		}
	}
	add("GPU (name, driver, memory)", e.GPU)
	add("CUDA (driver)", e.CUDA)
	add("NCCL", e.NCCL)
	add("NVSHMEM", e.NVSHMEM)
	add("MPS", e.MPS)
	add("PyTorch", e.Torch)
	return r
}
