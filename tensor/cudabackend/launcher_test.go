package cudabackend

import (
	"fmt"
	"strings"
	"testing"
)

// TestNewDataCheckRefusesPastTheSlots fills the data-check slots and
// expects the next NewDataCheck to return an error that names the check,
// the limit and the checks already made, instead of panicking; the slots
// handed out are distinct and follow the backend's own.
func TestNewDataCheckRefusesPastTheSlots(t *testing.T) {
	dataChecks.Lock()
	saved := dataChecks.names
	dataChecks.names = nil
	dataChecks.Unlock()
	t.Cleanup(func() {
		dataChecks.Lock()
		dataChecks.names = saved
		dataChecks.Unlock()
	})
	seen := map[flagSlot]bool{}
	for i := range maxDataChecks {
		c, err := NewDataCheck(fmt.Sprintf("check %d", i))
		if err != nil {
			t.Fatalf("data check %d of %d: %v", i+1, maxDataChecks, err)
		}
		if c.slot < firstDataCheck || c.slot >= numFlags || seen[c.slot] {
			t.Fatalf("data check %d: slot %d, expected a new one in [%d, %d)", i, c.slot, firstDataCheck, numFlags)
		}
		seen[c.slot] = true
	}
	c, err := NewDataCheck("one too many")
	if err == nil {
		t.Fatalf("data check %d: slot %d, expected an error", maxDataChecks+1, c.slot)
	}
	for _, want := range []string{`"one too many"`, "8 made already", `"check 0"`, `"check 7"`, "expected at most 8"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
	if c != (DataCheck{}) {
		t.Errorf("refused data check is %+v, expected the zero DataCheck", c)
	}
}
