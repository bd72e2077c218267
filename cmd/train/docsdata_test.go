package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dataBlocks are the ```sh blocks of README.md and docs/usage.md that run
// cmd/train on files of their own (a line with --val-data or
// --data-format), by file.
func dataBlocks(t *testing.T) map[string][]string {
	t.Helper()
	block := regexp.MustCompile("(?s)```sh\n(.*?)```")
	data := regexp.MustCompile(`go run \./cmd/train [^\n#]*--(val-data|data-format)\b`)
	out := map[string][]string{}
	for _, f := range []string{"README.md", "docs/usage.md"} {
		b, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllStringSubmatch(string(b), -1) {
			if data.MatchString(m[1]) {
				out[f] = append(out[f], m[1])
			}
		}
	}
	return out
}

// TestDocsDataBlocks runs, as written, every block of the docs that trains
// on files of its own (--val-data, --data-format): each line in order, in
// a directory that holds the repository's files as a fresh clone does
// (links to them), so that the files they name are the clone's and what
// they write (runs/...) stays in the test's directory. Every line must
// exit 0.
func TestDocsDataBlocks(t *testing.T) {
	blocks := dataBlocks(t)
	for _, f := range []string{"README.md", "docs/usage.md"} {
		if len(blocks[f]) == 0 {
			t.Errorf("%s: no ```sh block with a go run ./cmd/train line using --val-data or --data-format", f)
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"README.md", "docs/usage.md"} {
		for i, b := range blocks[f] {
			clone := t.TempDir()
			entries, err := os.ReadDir(root)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if n := e.Name(); n != "runs" && !strings.HasPrefix(n, ".") {
					if err := os.Symlink(filepath.Join(root, n), filepath.Join(clone, n)); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, line := range strings.Split(b, "\n") {
				if j := strings.Index(line, " #"); j >= 0 {
					line = line[:j]
				}
				line = strings.TrimSpace(line)
				if line == "" {
					continue
				}
				rest, ok := strings.CutPrefix(line, "go run ./cmd/train ")
				if !ok {
					t.Fatalf("%s block %d: %q is not a go run ./cmd/train line; this test runs only those", f, i+1, line)
				}
				out, code := runIn(t, clone, strings.Fields(rest)...)
				if code != 0 {
					t.Fatalf("%s block %d: %q exited %d:\n%s", f, i+1, line, code, out)
				}
				t.Logf("%s block %d: %q: %s", f, i+1, line, lastLine(out))
			}
		}
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
