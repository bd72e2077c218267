package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/train/routing"
)

// openRoutingDump opens world rank's routing dump in cfg.DumpRouting
// (--dump-routing; package train/routing), nil when the flag is unset:
// truncated for a new run, appended to on a resume.
func openRoutingDump(cfg Config, rank int, b tensor.Backend, ls []routing.Layer) (*routing.Dump, error) {
	if cfg.DumpRouting == "" {
		return nil, nil
	}
	d, err := routing.Open(cfg.DumpRouting, rank, cfg.Train.Resume != "", b, ls)
	if err != nil {
		return nil, fmt.Errorf("--dump-routing: %w", err)
	}
	return d, nil
}

// runRoutingDiff is `train routing-diff DIR1 DIR2`: it prints, per common
// step, the token-layers whose top-k set differs, and fails (exit status
// 1) naming the first step with a difference when there is one.
func runRoutingDiff(args []string) error {
	fs := flag.NewFlagSet("train routing-diff", flag.ContinueOnError)
	quiet := fs.Bool("quiet", false, "print only the steps that differ and the summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("routing-diff: expected two --dump-routing directories, found %q", fs.Args())
	}
	a, err := routing.Read(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("routing-diff: %w", err)
	}
	b, err := routing.Read(fs.Arg(1))
	if err != nil {
		return fmt.Errorf("routing-diff: %w", err)
	}
	steps, only, err := routing.Diff(a, b)
	if err != nil {
		return fmt.Errorf("routing-diff: %w", err)
	}
	for _, o := range only {
		fmt.Println("routing-diff:", o)
	}
	if len(steps) == 0 {
		return errors.New("routing-diff: no common steps to compare")
	}
	total, tokens, first := 0, 0, -1
	for _, d := range steps {
		total += d.Diffs
		tokens += d.Tokens
		if d.Diffs > 0 && first < 0 {
			first = d.Step
		}
		if *quiet && d.Diffs == 0 {
			continue
		}
		per := make([]string, len(d.PerLayer))
		for i, n := range d.PerLayer {
			per[i] = fmt.Sprint(n)
		}
		line := fmt.Sprintf("step %d: %d of %d token-layers differ (per MoE layer: %s)", d.Step, d.Diffs, d.Tokens, strings.Join(per, " "))
		if d.First != "" {
			line += "; first: " + d.First
		}
		fmt.Println(line)
	}
	if first < 0 {
		fmt.Printf("routing-diff: identical: %d steps, %d token-layers\n", len(steps), tokens)
		return nil
	}
	return fmt.Errorf("routing-diff: %d of %d token-layers differ over %d steps; first difference at step %d", total, tokens, len(steps), first)
}
