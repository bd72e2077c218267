package main

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/overlap/strategies"
)

// --fused-transfer: used as given where a fused site can run (the fused
// strategy the run builds has it), refused when unknown or when nothing
// would use it; unset, $ASYNCTP_FUSED_TRANSFER is checked and used.
func TestFusedTransferFlag(t *testing.T) {
	t.Setenv(peercopy.TransferEnv, "")
	out := t.TempDir()
	gpu := func(extra ...string) []string {
		a := []string{"--model", "tiny", "--device", "cuda", "--comm", "nvshmem", "--nproc", "2", "--tp", "2", "--out", out}
		return append(a, extra...)
	}
	for _, tr := range []string{"pull", "put"} {
		for _, ov := range []string{"fused", "auto"} {
			cfg, err := loadConfig(gpu("--overlap", ov, "--fused-transfer", tr))
			if err != nil {
				t.Fatalf("--overlap %s --fused-transfer %s: %v", ov, tr, err)
			}
			if cfg.FusedTransfer != tr {
				t.Errorf("--fused-transfer %s: config has %q", tr, cfg.FusedTransfer)
			}
			if f, ok := fusedOf(cfg).(strategies.Fused); !ok || f.Options.Transfer != tr {
				t.Errorf("--fused-transfer %s: the run's fused strategy is %#v, want transfer %s", tr, fusedOf(cfg), tr)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{gpu("--overlap", "fused", "--fused-transfer", "push"), `--fused-transfer: fused transfer "push": expected one of pull, put`},
		{gpu("--overlap", "collective", "--fused-transfer", "put"), "--fused-transfer put: no site asks for fused or auto"},
		{par(out, "--fused-transfer", "put"), "--fused-transfer put: the fused strategy needs symmetric memory with peer pointers: --comm nvshmem or nccl+nvshmem on GPUs"},
	} {
		if _, err := loadConfig(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	// The environment, when no flag gives the transfer.
	t.Setenv(peercopy.TransferEnv, "put")
	cfg, err := loadConfig(gpu("--overlap", "fused"))
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := fusedOf(cfg).(strategies.Fused); !ok || f.Options.Transfer != "put" || cfg.FusedTransfer != "" {
		t.Errorf("$%s=put: fused strategy %#v, config %q; want transfer put, the config left unset", peercopy.TransferEnv, fusedOf(cfg), cfg.FusedTransfer)
	}
	if _, err := loadConfig(par(out)); err != nil { // a CPU run: the variable is checked, not refused
		t.Errorf("$%s=put on a CPU run: %v", peercopy.TransferEnv, err)
	}
	cfg, err = loadConfig(gpu("--overlap", "fused", "--fused-transfer", "pull")) // the flag wins
	if err != nil || fusedOf(cfg).(strategies.Fused).Options.Transfer != "pull" {
		t.Errorf("--fused-transfer pull with $%s=put: %v, %v; want pull", peercopy.TransferEnv, fusedOf(cfg), err)
	}
	t.Setenv(peercopy.TransferEnv, "fast")
	if _, err := loadConfig(par(out)); err == nil || !strings.Contains(err.Error(), "$"+peercopy.TransferEnv+`: fused transfer "fast"`) {
		t.Errorf("$%s=fast: %v, want an error naming the variable and the value", peercopy.TransferEnv, err)
	}
}
