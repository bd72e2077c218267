package apicheck

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// light are the packages a Go program imports to build and train its own
// model: none may depend on the training loop's reporting (train, which
// draws loss.png and the progress bar) or on what that pulls in.
var light = []string{
	"tensor", "tensor/cpu", "layers", "optim", "safetensors",
	"comm", "comm/local", "overlap", "parallel/tp", "parallel/ep",
	"parallel/shard", "parallel/grads", "tokens",
}

// heavy are import-path fragments of the reporting dependencies.
var heavy = []string{
	"gonum.org/v1/plot", "progressbar", "go-fonts", "go-pdf", "go-latex",
	"svgo", "freetype", "golang.org/x/image", "sbinet/gg",
	"github.com/asynctp/asynctp/train",
}

// goCommand finds the go command that runs the tests.
func goCommand(t *testing.T) string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(p); err != nil {
		t.Fatalf("the go command is neither on PATH nor at %s: go list -deps cannot run", p)
	}
	return p
}

// TestLightDependencies lists the dependencies of the light packages with
// go list -deps and fails on any heavy one, naming the package that pulls
// it in.
func TestLightDependencies(t *testing.T) {
	const mod = "github.com/asynctp/asynctp/"
	for _, pkg := range light {
		out, err := exec.Command(goCommand(t), "list", "-deps", mod+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 2 || deps[len(deps)-1] != mod+pkg {
			t.Fatalf("go list -deps %s printed %d packages, the last %q: expected the package itself last", pkg, len(deps), deps[len(deps)-1])
		}
		for _, d := range deps {
			for _, h := range heavy {
				if strings.Contains(d, h) {
					t.Errorf("%s depends on %s (matches %q)", pkg, d, h)
				}
			}
		}
	}
}
