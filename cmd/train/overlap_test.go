package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --overlap pipelined trains the same curve as --overlap collective, step
// by step within 1e-5 (CPU, float32): TP 2 and 4 with and without sequence
// parallelism, and MoE with EP (the expert path keeps collective; its
// all-to-all's TP neighbours are pipelined).
func TestOverlapPipelinedFollowsCollective(t *testing.T) {
	for _, args := range [][]string{
		{"--tp", "2"}, {"--tp", "4"}, {"--tp", "2", "--sequence-parallel"}, {"--tp", "4", "--sequence-parallel"},
		append([]string{"--tp", "2", "--ep", "2"}, moe...),
		append([]string{"--tp", "2", "--dp", "2", "--ep", "4", "--sequence-parallel"}, moe...),
	} {
		name := strings.Join(args, " ")
		coll := metrics(t, trainRun(t, append(args, "--overlap", "collective")...))
		pipe := metrics(t, trainRun(t, append(args, "--overlap", "pipelined")...))
		sameRun(t, name, pipe, coll, 1e-5)
	}
}

// Rank 0 says which strategy each site kind got, and why the default did
// not apply where it did not; config.json records the choice.
func TestOverlapSummary(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	msg, code := runMain(t, par(out, append([]string{"--tp", "2", "--ep", "2", "--overlap", "pipelined"}, moe...)...)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, msg)
	}
	if !strings.Contains(msg, "overlap: matmul-all-reduce: pipelined (") {
		t.Errorf("no summary of the matmul-all-reduce sites; output:\n%s", msg)
	}
	if !strings.Contains(msg, "overlap: expert: collective (1 site, the group's collectives over local); pipelined for expert site \"blocks.0.moe\": group ep[0 1] has no symmetric memory: it needs symmetric memory with peer pointers (comm.SymmetricMemory: NVSHMEM's, alone or beside NCCL's collectives)") {
		t.Errorf("want the expert sites' line saying why they keep collective; output:\n%s", msg)
	}
	if strings.Count(msg, "overlap: ") != 2 {
		t.Errorf("want one summary line per site kind, from rank 0 only; output:\n%s", msg)
	}
	if cfg := readConfig(t, out); cfg.Overlap.Default != "pipelined" {
		t.Errorf("config.json: overlap %+v, want default pipelined", cfg.Overlap)
	}

	msg, code = runMain(t, par(filepath.Join(t.TempDir(), "out"), "--tp", "2", "--sequence-parallel", "--overlap", "auto")...)
	if code != 0 || !strings.Contains(msg, "auto: no autotune cache yet, so collective") ||
		!strings.Contains(msg, "overlap: all-gather-matmul: collective (") || !strings.Contains(msg, "overlap: matmul-reduce-scatter: collective (") {
		t.Errorf("--overlap auto: exit %d; want it to say it picks collective; output:\n%s", code, msg)
	}
}

// Per-site choices from the config file: a layer pattern wins over its
// kind and over the default.
func TestOverlapPerSite(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "c.json")
	js := `{"overlap": {"default": "pipelined", "sites": {"matmul-reduce-scatter": "collective", "blocks.0.mlp.gate_up": "collective"}}}`
	if err := os.WriteFile(conf, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	msg, code := runMain(t, par(filepath.Join(dir, "out"), "--config", conf, "--tp", "2", "--sequence-parallel")...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, msg)
	}
	for _, want := range []string{
		// gate_up collective; qkv and the LM head pipelined
		`overlap: all-gather-matmul: collective (1 site, the group's collectives over local) as sites["blocks.0.mlp.gate_up"] asks, pipelined (2 sites, exchanges on the group's collectives over local) as the default asks`,
		`overlap: matmul-reduce-scatter: collective (2 sites, the group's collectives over local) as sites["matmul-reduce-scatter"] asks`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("want %q; output:\n%s", want, msg)
		}
	}
}

// A strategy that cannot run, or a site choice that matches nothing, is
// an error before any step, saying why.
func TestOverlapErrors(t *testing.T) {
	dir := t.TempDir()
	conf := func(js string) string {
		p := filepath.Join(dir, strings.NewReplacer("{", "", "}", "", "\"", "", ":", "", " ", "", ",", "", ".", "", "*", "").Replace(js)+".json")
		if err := os.WriteFile(p, []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown", []string{"--tp", "2", "--overlap", "turbo"}, `default strategy "turbo": expected one of collective, pipelined, fused, auto`},
		{"fused without nvshmem", []string{"--tp", "2", "--overlap", "fused"}, "strategy fused is not available in this run: it needs symmetric memory with peer pointers: --comm nvshmem or nccl+nvshmem on GPUs (this run: --comm local, --device cpu)"},
		{"fused over tcp", []string{"--tp", "2", "--nproc", "2", "--comm", "tcp", "--overlap", "fused"}, "--comm nvshmem or nccl+nvshmem on GPUs (this run: --comm tcp"},
		{"fused on one rank", []string{"--overlap", "fused"}, "strategy fused is not available in this run"},
		{"unknown site strategy", []string{"--tp", "2", "--config", conf(`{"overlap": {"sites": {"blocks.0.*": "fast"}}}`)}, `site "blocks.0.*": strategy "fast"`},
		{"site that matches nothing", []string{"--tp", "2", "--config", conf(`{"overlap": {"sites": {"blocks.7.attn.qkv": "pipelined"}}}`)}, `sites "blocks.7.attn.qkv" match no communication site`},
		{"expert path asked for pipelined", append([]string{"--tp", "2", "--ep", "2", "--config", conf(`{"overlap": {"sites": {"expert": "pipelined"}}}`)}, moe...),
			`expert site "blocks.0.moe" on ep[0 1]: sites["expert"] asks for pipelined: pipelined for expert site "blocks.0.moe": group ep[0 1] has no symmetric memory: it needs symmetric memory with peer pointers (comm.SymmetricMemory: NVSHMEM's, alone or beside NCCL's collectives)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg, code := runMain(t, par(filepath.Join(t.TempDir(), "out"), c.args...)...)
			if code == 0 || !strings.Contains(msg, c.want) {
				t.Fatalf("exit %d, want non-zero with %q; output:\n%s", code, c.want, msg)
			}
		})
	}
}

// TestAutotuneFusedCandidate: --autotune takes the fused strategy as a
// candidate exactly where the run can build it (NVSHMEM on GPUs).
func TestAutotuneFusedCandidate(t *testing.T) {
	cfg := tinyPreset()
	for _, c := range []struct {
		comm, device string
		want         bool
	}{{"nvshmem", "cuda", true}, {"nvshmem", "auto", true}, {"tcp", "cpu", false}, {"nvshmem", "cpu", false}, {"nccl", "cuda", false}, {"nccl+nvshmem", "cuda", true}} {
		cfg.Parallel.Comm, cfg.Device = c.comm, c.device
		f := fusedOf(cfg)
		if got := f != nil; got != c.want {
			t.Errorf("--comm %s --device %s: fused candidate %v, want %v", c.comm, c.device, f, c.want)
		}
		if f != nil && f.Name() != "fused" {
			t.Errorf("--comm %s: candidate %q, want fused", c.comm, f.Name())
		}
	}
}
