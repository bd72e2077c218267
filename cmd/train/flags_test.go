package main

import (
	"encoding/json"
	"flag"
	"io"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// flatJSON is v's JSON as "section.field" → value (one level of sections,
// as the config file has).
func flatJSON(t *testing.T, v any) map[string]string {
	t.Helper()
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, raw := range top {
		var sec map[string]json.RawMessage
		if json.Unmarshal(raw, &sec) == nil {
			for f, r := range sec {
				out[k+"."+f] = string(r)
			}
			continue
		}
		out[k] = string(raw)
	}
	return out
}

// Each flag of the table, given alone with a value other than the preset's,
// changes exactly the config fields its JSON paths name (and a flag
// without paths none of them): the name, the paths and the field of a
// flag's row agree.
func TestFlagTableSetsItsPaths(t *testing.T) {
	for _, d := range trainFlags {
		if d.name == "config" {
			continue // read by loadConfigIn, applies nothing
		}
		fs := newFlagSet()
		fs.SetOutput(io.Discard)
		f := fs.Lookup(d.name)
		var arg string
		switch f.Value.(flag.Getter).Get().(type) {
		case bool:
			arg = "-" + d.name + "=" + map[string]string{"true": "false", "false": "true"}[f.DefValue]
		case string:
			arg = "-" + d.name + "=x"
		case time.Duration:
			arg = "-" + d.name + "=7s"
		case float64:
			arg = "-" + d.name + "=0.375"
		default:
			arg = "-" + d.name + "=7"
		}
		if err := fs.Parse([]string{arg}); err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		before := tinyPreset()
		after := tinyPreset()
		fs.applyFlags(&after, fs.given())
		a, b := flatJSON(t, before), flatJSON(t, after)
		var changed []string
		for k := range b {
			if a[k] != b[k] {
				changed = append(changed, k)
			}
		}
		sort.Strings(changed)
		want := slices.Clone(d.paths)
		if d.name == "world" && before.Parallel.DP != 0 {
			want = append(want, "parallel.dp") // --world without --dp derives dp
		}
		sort.Strings(want)
		if !slices.Equal(changed, want) {
			t.Errorf("%s changed %v, its row names %v", arg, changed, want)
		}
		for _, p := range d.paths {
			if _, ok := b[p]; !ok {
				t.Errorf("--%s: its path %q is no field of the config's JSON", d.name, p)
			}
		}
	}
}

// The table has one row per flag and every section of -help lists some.
func TestFlagTableRows(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range trainFlags {
		if seen[d.name] {
			t.Errorf("--%s declared twice", d.name)
		}
		seen[d.name] = true
		if !slices.Contains(flagSections, d.section) || d.help == "" {
			t.Errorf("--%s: section %q, help %q; want a section of -help and a help text", d.name, d.section, d.help)
		}
	}
	var help strings.Builder
	fs := newFlagSet()
	printFlags(&help, fs.FlagSet)
	for _, sec := range flagSections {
		if !strings.Contains(help.String(), "\n"+sec+":\n  -") {
			t.Errorf("-help: section %q missing or empty:\n%s", sec, help.String())
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(help.String(), "  -"+f.Name+" ") && !strings.Contains(help.String(), "  -"+f.Name+"\n") {
			t.Errorf("-help does not list -%s", f.Name)
		}
	})
}
