package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
)

// checkFusedTransfer resolves the fused strategy's transfer
// (strategies.Options.Transfer, peercopy.Engine.Transfer): --fused-transfer or the config's
// "fused_transfer" as given (pull or put), refused where no site could
// take the fused strategy (it would change nothing); unset, then
// $ASYNCTP_FUSED_TRANSFER (checked, not refused on a run without fused
// sites: a variable of a script's environment); unset too, pull.
func (c *Config) checkFusedTransfer() error {
	if c.FusedTransfer == "" {
		// Not written into the config: processes that re-read it (--nproc)
		// read the same environment.
		_, err := peercopy.TransferFromEnv()
		return err
	}
	if _, err := peercopy.ParseTransfer(c.FusedTransfer); err != nil {
		return fmt.Errorf("--fused-transfer: %w", err)
	}
	if _, missing := overlapStrategies(*c); missing["fused"] != "" {
		// overlapStrategies' rule and words for where fused cannot run.
		return fmt.Errorf("--fused-transfer %s: the fused strategy %s, so it would change nothing",
			c.FusedTransfer, strings.TrimPrefix(missing["fused"], "it "))
	}
	if !mayUseFused(c.Overlap) {
		return fmt.Errorf("--fused-transfer %s: no site asks for fused or auto (--overlap %s), so it would change nothing; expected --overlap fused or auto (or a site configured so)",
			c.FusedTransfer, orDefault(c.Overlap.Default, "collective"))
	}
	return nil
}

// mayUseFused says whether any site may get the fused strategy.
func mayUseFused(c overlap.Config) bool {
	if c.Default == "fused" || c.Default == "auto" {
		return true
	}
	for _, v := range c.Sites {
		if v == "fused" || v == "auto" {
			return true
		}
	}
	return false
}

// fusedTransfer is the run's fused transfer: the config's, else
// $ASYNCTP_FUSED_TRANSFER's (as the variable says: a bad value, which
// validate refuses first, is refused by the strategy too).
func fusedTransfer(cfg Config) string {
	if t := cfg.FusedTransfer; t != "" {
		return t
	}
	return os.Getenv(peercopy.TransferEnv)
}
