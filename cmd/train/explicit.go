package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// explicitFields is the set of config fields the file (its JSON) and the
// flags given (set) name. A preset named by --model or the file's
// "preset" makes every model field explicit: the preset says what the
// model is.
func explicitFields(file []byte, set map[string]bool) (map[string]bool, error) {
	ex := map[string]bool{}
	for f := range set {
		for _, k := range flagPaths[f] {
			ex[k] = true
		}
	}
	if file != nil {
		var top map[string]json.RawMessage
		if err := json.Unmarshal(file, &top); err != nil {
			return nil, err
		}
		for k, raw := range top {
			ex[k] = true
			var sec map[string]json.RawMessage
			if json.Unmarshal(raw, &sec) == nil {
				for f := range sec {
					ex[k+"."+f] = true
				}
			}
		}
	}
	return ex, nil
}

// modelFields lists the model fields given explicitly (all of them after
// an explicit preset), sorted.
func (c *Config) explicitModel() map[string]bool {
	out := map[string]bool{}
	for k := range c.explicit {
		if f, ok := strings.CutPrefix(k, "model."); ok {
			out[f] = true
		}
	}
	if c.explicit["preset"] {
		out["*"] = true
	}
	return out
}

// Explicit reports whether the config field key ("train.warmup") was given
// by the file or a flag.
func (c *Config) Explicit(key string) bool { return c.explicit[key] }

// fieldDiffs compares two JSON objects field by field and returns
// "name: a vs b" for each field that differs, sorted.
func fieldDiffs(a, b any, nameA, nameB string, only func(field string) bool) ([]string, error) {
	ma, err := toMap(a)
	if err != nil {
		return nil, err
	}
	mb, err := toMap(b)
	if err != nil {
		return nil, err
	}
	var diffs []string
	for k, va := range ma {
		if only != nil && !only(k) {
			continue
		}
		if vb := mb[k]; string(va) != string(vb) {
			diffs = append(diffs, fmt.Sprintf("%s: %s %s, %s %s", k, nameA, orAbsent(va), nameB, orAbsent(vb)))
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

func orAbsent(r json.RawMessage) string {
	if r == nil {
		return "(absent)"
	}
	return string(r)
}

func toMap(v any) (map[string]json.RawMessage, error) {
	js, ok := v.(json.RawMessage)
	if !ok {
		var err error
		if js, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	var m map[string]json.RawMessage
	return m, json.Unmarshal(js, &m)
}
