package main

import (
	"strings"
	"testing"
)

// ASYNCTP_ATTENTION is a CUDA setting: refused on the CPU; an unknown value
// is refused naming what is expected, and the retired "onepass" saying
// where it went.
func TestAttentionEnv(t *testing.T) {
	t.Setenv(envAttention, "fa2")
	if _, _, _, err := openBackend("cpu", GroupedAuto); err == nil || !strings.Contains(err.Error(), "is a CUDA setting") {
		t.Errorf("fa2 on the CPU: %v, want a refusal", err)
	}
	t.Setenv(envAttention, "fast")
	if _, _, _, err := openBackend("cuda", GroupedAuto); err == nil || !strings.Contains(err.Error(), `expected wgmma or fa2`) {
		t.Errorf("an unknown value: %v, want a refusal naming wgmma and fa2", err)
	}
	t.Setenv(envAttention, "onepass")
	if _, _, _, err := cudaOptions(GroupedAuto); err == nil || !strings.Contains(err.Error(), "retired to cuda/kernels/experimental/") {
		t.Errorf("onepass: %v, want a refusal saying it was retired to cuda/kernels/experimental/", err)
	}
	t.Setenv(envAttention, "fa2")
	if opts, extra, set, err := cudaOptions(GroupedAuto); err != nil || len(opts) != 1 || !strings.Contains(extra, "FA2") || set != "ASYNCTP_ATTENTION=fa2" {
		t.Errorf("fa2: %d options, %q, %q, %v; want the FA2 kernels' option and note", len(opts), extra, set, err)
	}
	t.Setenv(envAttention, "wgmma")
	if opts, extra, set, err := cudaOptions(GroupedAuto); err != nil || len(opts) != 1 || !strings.Contains(extra, "wgmma") || set != "ASYNCTP_ATTENTION=wgmma" {
		t.Errorf("wgmma: %d options, %q, %q, %v; want the wgmma backward's option and note", len(opts), extra, set, err)
	}
	t.Setenv(envAttention, "")
	if opts, extra, set, err := cudaOptions(GroupedAuto); err != nil || opts != nil || extra != "" || set != "" {
		t.Errorf("unset: %v %q %q %v, want the default", opts, extra, set, err)
	}
}

// ASYNCTP_GEMM likewise: a CUDA setting, and an unknown value is refused
// naming both engines.
func TestGEMMEnv(t *testing.T) {
	t.Setenv(envAttention, "")
	t.Setenv(envGEMM, "asynctp")
	if _, _, _, err := openBackend("cpu", GroupedAuto); err == nil || !strings.Contains(err.Error(), "ASYNCTP_GEMM=asynctp is a CUDA setting") {
		t.Errorf("asynctp on the CPU: %v, want a refusal", err)
	}
	if opts, extra, set, err := cudaOptions(GroupedAuto); err != nil || len(opts) != 1 || !strings.Contains(extra, "asynctp engine") || set != "ASYNCTP_GEMM=asynctp" {
		t.Errorf("asynctp: %d options, %q, %q, %v; want the engine's option and note", len(opts), extra, set, err)
	}
	t.Setenv(envGEMM, "cutlass")
	if _, _, _, err := openBackend("cuda", GroupedAuto); err == nil || !strings.Contains(err.Error(), "expected cublaslt or asynctp") {
		t.Errorf("an unknown value: %v, want a refusal naming both", err)
	}
}
