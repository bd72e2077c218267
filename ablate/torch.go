package ablate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// TorchRow is one line of bench/torch_ablate.py: a PyTorch implementation
// of an op at a shape, at world size 1 on one GPU (NCCL refuses two ranks
// on one GPU).
type TorchRow struct {
	Impl   string  `json:"impl"` // torch-nccl, torch-symm-mem
	Op     string  `json:"op"`
	M      int     `json:"m"`
	N      int     `json:"n"`
	K      int     `json:"k"`
	World  int     `json:"world"`
	US     float64 `json:"us,omitempty"`
	TFLOPS float64 `json:"tflops,omitempty"`
	Bytes  float64 `json:"bytes,omitempty"`
	AlgBW  float64 `json:"algbw_gbps,omitempty"`
	Error  string  `json:"error,omitempty"`
	Torch  string  `json:"torch,omitempty"`
}

// TorchShape is a shape the script times.
type TorchShape struct {
	Op string `json:"op"`
	M  int    `json:"m"`
	N  int    `json:"n"`
	K  int    `json:"k"`
}

// RunTorch runs script with python3 on the shapes when python3 can import
// torch with CUDA; otherwise it returns no rows and why.
func RunTorch(ctx context.Context, python, script string, shapes []TorchShape, reps int, timeout time.Duration) ([]TorchRow, string, error) {
	if _, err := exec.LookPath(python); err != nil {
		return nil, fmt.Sprintf("no %s on PATH: no PyTorch rows", python), nil
	}
	probe := exec.CommandContext(ctx, python, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())")
	out, err := probe.CombinedOutput()
	if err != nil {
		return nil, fmt.Sprintf("%s cannot import torch: no PyTorch rows (%s)", python, lastLine(out)), nil
	}
	if !strings.Contains(string(out), "True") {
		return nil, fmt.Sprintf("torch %s has no CUDA device: no PyTorch rows", strings.Fields(string(out))[0]), nil
	}
	if _, err := os.Stat(script); err != nil {
		return nil, "", fmt.Errorf("PyTorch rows: script %s: %w", script, err)
	}
	js, _ := json.Marshal(shapes)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, script, "--reps", fmt.Sprint(reps))
	cmd.Stdin = bytes.NewReader(js)
	cmd.Env = append(os.Environ(), "NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	res, err := cmd.Output()
	var rows []TorchRow
	sc := bufio.NewScanner(bytes.NewReader(res))
	for sc.Scan() {
		var r TorchRow
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Impl != "" {
			rows = append(rows, r)
		}
	}
	note := strings.TrimSpace(string(out))
	if err != nil {
		note += fmt.Sprintf("; the script failed (%v): %s", err, lastLine(stderr.Bytes()))
	}
	return rows, "torch " + note, nil
}

func lastLine(b []byte) string {
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	return l[len(l)-1]
}
