package main

import (
	"strings"
	"testing"
)

// ASYNCTP_ATTENTION is a CUDA setting: refused on the CPU, and an unknown
// value is refused naming what is expected.
func TestAttentionEnv(t *testing.T) {
	t.Setenv(envAttention, "onepass")
	if _, _, _, err := openBackend("cpu", GroupedAuto); err == nil || !strings.Contains(err.Error(), "is a CUDA setting") {
		t.Errorf("onepass on the CPU: %v, want a refusal", err)
	}
	t.Setenv(envAttention, "fast")
	if _, _, _, err := openBackend("cuda", GroupedAuto); err == nil || !strings.Contains(err.Error(), `expected onepass`) {
		t.Errorf("an unknown value: %v, want a refusal naming onepass", err)
	}
	t.Setenv(envAttention, "")
	if opts, extra, err := cudaOptions(GroupedAuto); err != nil || opts != nil || extra != "" {
		t.Errorf("unset: %v %q %v, want the default", opts, extra, err)
	}
}
