package rendezvous

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A store that knows its world turns away a rank outside it, naming the
// world; the ranks inside still join.
func TestStoreRefusesRankOutsideWorld(t *testing.T) {
	srv, err := Serve(context.Background(), "127.0.0.1:0", "job-w")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.SetWorld(2)
	opts := Options{Timeout: 2 * time.Second}
	if _, err := Dial(context.Background(), srv.Addr(), "job-w", 7, opts); err == nil || !strings.Contains(err.Error(), "outside the world of 2 ranks") {
		t.Fatalf("rank 7 of a world of 2: %v, want a refusal naming the world", err)
	}
	c, err := Dial(context.Background(), srv.Addr(), "job-w", 1, opts)
	if err != nil {
		t.Fatalf("rank 1 of 2: %v", err)
	}
	c.Close()
}
