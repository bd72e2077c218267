package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docLine is a build/train command of the docs: its arguments and the
// world its launcher gives.
type docLine struct {
	file, text string
	args       []string
	o          origin
}

// docLines finds every build/train command of README.md and docs/usage.md:
// the lines of ```sh blocks and the code spans of the prose that run it,
// with the world of their launcher (torchrun's --nproc-per-node ×
// --nnodes, srun's -N × --ntasks-per-node, mpirun's -np,
// ASYNCTP_WORLD_SIZE in the same block or paragraph; --nproc's is the
// command's own).
func docLines(t *testing.T) []docLine {
	t.Helper()
	block := regexp.MustCompile("(?s)```sh\n(.*?)```")
	span := regexp.MustCompile("`(build/train [^`]*)`")
	worldVar := regexp.MustCompile(`ASYNCTP_WORLD_SIZE=(\d+)`)
	var out []docLine
	for _, f := range []string{"../../README.md", "../../docs/usage.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		add := func(cmd string, world int) {
			prefix, rest, ok := strings.Cut(cmd, "build/train ")
			if !ok || strings.Contains(prefix, "go build") || strings.Contains(prefix, "#") {
				return
			}
			if i := strings.Index(rest, " #"); i >= 0 {
				rest = rest[:i]
			}
			args := strings.Fields(strings.TrimSuffix(strings.TrimSpace(rest), "&"))
			if len(args) > 0 && !strings.HasPrefix(args[0], "-") { // a subcommand (export, logits...): not a launch
				return
			}
			p := strings.Fields(prefix)
			flag := func(names ...string) int {
				for i := range p[:max(len(p)-1, 0)] {
					for _, n := range names {
						if p[i] == n {
							v, _ := strconv.Atoi(p[i+1])
							return v
						}
					}
				}
				return 0
			}
			switch {
			case strings.Contains(prefix, "torchrun"):
				world = flag("--nproc-per-node") * max(flag("--nnodes"), 1)
			case strings.Contains(prefix, "srun"):
				world = flag("-N", "--nodes") * flag("--ntasks-per-node")
			case strings.Contains(prefix, "mpirun"):
				world = flag("-np", "-n")
			}
			o := origin{}
			if world > 0 {
				o = origin{launched: true, world: world}
			}
			out = append(out, docLine{file: filepath.Base(f), text: strings.TrimSpace(cmd), args: args, o: o})
		}
		for _, m := range block.FindAllStringSubmatch(text, -1) {
			world := 0
			if w := worldVar.FindStringSubmatch(m[1]); w != nil {
				world, _ = strconv.Atoi(w[1])
			}
			for _, l := range strings.Split(m[1], "\n") {
				add(l, world)
			}
		}
		for _, par := range strings.Split(text, "\n\n") {
			world := 0
			if w := worldVar.FindStringSubmatch(par); w != nil {
				world, _ = strconv.Atoi(w[1])
			}
			for _, m := range span.FindAllStringSubmatch(par, -1) {
				add(strings.Join(strings.Fields(m[1]), " "), world)
			}
		}
	}
	return out
}

// Every launcher line of README.md and docs/usage.md (--nproc, torchrun,
// srun, mpirun, two nodes by hand) is a run cmd/train takes as written: its
// flags parse, and its layout and overlap settings are valid for the world
// its launcher gives (a model whose heads divide --tp, a transport that
// exists...). The GPU lines are checked up to the device, which this
// machine may not have; the two-node recipe runs in TestTwoNodes.
func TestDocsLauncherLines(t *testing.T) {
	lines := docLines(t)
	launchers := map[string]bool{}
	for _, l := range lines {
		for _, name := range []string{"--nproc", "torchrun", "srun", "mpirun"} {
			if strings.Contains(l.text, name) {
				launchers[name] = true
			}
		}
		t.Logf("%s: world %d (launched %v): %s", l.file, l.o.world, l.o.launched, l.text)
		args := append([]string(nil), l.args...)
		for i := range args {
			if args[i] == "--out" && i+1 < len(args) {
				args[i+1] = filepath.Join(t.TempDir(), "out")
			}
		}
		cfg, err := loadConfigIn(args, l.o)
		if err == nil {
			err = prepare(&cfg, l.o)
		}
		if err == nil {
			err = checkOverlap(cfg)
		}
		if err != nil {
			t.Errorf("%s: %q (world %d): %v", l.file, l.text, l.o.world, err)
		}
	}
	for _, name := range []string{"--nproc", "torchrun", "srun", "mpirun"} {
		if !launchers[name] {
			t.Errorf("no build/train line with %s found in the docs (found %d lines): the parser missed it", name, len(lines))
		}
	}
}
