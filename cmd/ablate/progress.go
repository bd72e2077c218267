package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/asynctp/asynctp/ablate"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress shows the matrix's progress: a bar on a terminal, a plain line
// per cell otherwise; every cell's line also goes to the log file.
type progress struct {
	mu    sync.Mutex
	bar   *progressbar.ProgressBar
	lines io.Writer // nil: none
	log   *os.File
	n, i  int
}

func newProgress(mode string, stdout io.Writer, n int, logPath string) *progress {
	p := &progress{n: n}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err == nil {
		p.log, _ = os.Create(logPath)
	}
	tty := false
	if f, ok := stdout.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	switch {
	case mode == "bar" || (mode == "auto" && tty):
		p.bar = progressbar.NewOptions(n, progressbar.OptionSetWriter(stdout), progressbar.OptionSetDescription("cells"),
			progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionClearOnFinish())
	case mode == "lines" || mode == "auto":
		p.lines = stdout
	}
	return p
}

func line(r ablate.Result) string {
	s := fmt.Sprintf("%s: %s", r.ID(), r.Status)
	switch {
	case r.Timed():
		s += fmt.Sprintf(" %.1f µs (rel. err %.1e)", r.MedianUS, r.RelErr)
	case r.Reason != "":
		s += ": " + r.Reason
	}
	return s
}

func (p *progress) done(r ablate.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.i++
	l := fmt.Sprintf("[%d/%d] %s\n", p.i, p.n, line(r))
	if p.log != nil {
		p.log.WriteString(l)
	}
	if p.bar != nil {
		p.bar.Add(1)
	}
	if p.lines != nil {
		io.WriteString(p.lines, l)
	}
}

func (p *progress) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		p.bar.Finish()
		p.bar = nil
	}
	if p.log != nil {
		p.log.Close()
		p.log = nil
	}
}
