package comm_test

import (
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
)

func TestCheckSplit(t *testing.T) {
	c := local.NewWorld(1)[0]
	defer c.Close()
	for _, ok := range [][2]int{{0, 0}, {comm.NoColor, 5}, {math.MaxInt32, math.MinInt32}} {
		if err := comm.CheckSplit(c, ok[0], ok[1]); err != nil {
			t.Errorf("CheckSplit(%d, %d): %v", ok[0], ok[1], err)
		}
	}
	for _, bad := range []struct {
		color, key int
		want       string
	}{{-2, 0, "color -2"}, {math.MaxInt32 + 1, 0, "color"}, {0, math.MaxInt32 + 1, "key"}, {0, math.MinInt32 - 1, "key"}} {
		err := comm.CheckSplit(c, bad.color, bad.key)
		if err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), comm.OpSplit) {
			t.Errorf("CheckSplit(%d, %d) = %v, want an error naming %q and the op", bad.color, bad.key, err, bad.want)
		}
	}
}
