//go:build asynctp_emu

package cudabackend

import (
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tensor"
)

// TestEmuPhaseTimes: marks while a timer runs come back as phases in the
// order first marked, with their counts, summing to the run's time; marks
// without a timer are ignored; a second timer is refused while one runs.
func TestEmuPhaseTimes(t *testing.T) {
	b := openEmu(t)
	a, c := b.Zeros(tensor.Float32, 64, 64), b.Zeros(tensor.Float32, 64, 64)
	b.Fill(a, 0.5)
	tensor.MarkPhase(b, "ignored") // no timer yet
	wall := time.Now()
	p, err := b.StartPhases()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.StartPhases(); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Errorf("a second StartPhases: %v, want a refusal", err)
	}
	for range 3 {
		tensor.MarkPhase(b, "matmul")
		b.MatMul(c, a, a, false, false, 1, 0)
		tensor.MarkPhase(b, "add")
		b.Add(c, c, a)
	}
	tensor.MarkPhase(b, tensor.PhaseOther)
	ph, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(wall)
	var names []string
	var sum time.Duration
	for _, x := range ph {
		names = append(names, x.Name)
		sum += x.Total
		if x.Total < 0 {
			t.Errorf("phase %s: total %v, want ≥ 0", x.Name, x.Total)
		}
	}
	if got := strings.Join(names, ","); got != "(start),matmul,add,other" {
		t.Fatalf("phases %s, want (start),matmul,add,other (the ignored mark came before the timer)", got)
	}
	if ph[1].Count != 3 || ph[2].Count != 3 || ph[3].Count != 1 {
		t.Errorf("counts %d, %d, %d, want 3, 3, 1", ph[1].Count, ph[2].Count, ph[3].Count)
	}
	if ph[1].Total <= 0 {
		t.Errorf("matmul phases took %v, want > 0", ph[1].Total)
	}
	if sum > elapsed {
		t.Errorf("the phases sum to %v, more than the %v the run took", sum, elapsed)
	}
	// The timer is detached: a new one starts, and marks before it are not its own.
	p2, err := b.StartPhases()
	if err != nil {
		t.Fatalf("StartPhases after Stop: %v", err)
	}
	ph2, err := p2.Stop()
	if err != nil || len(ph2) != 1 || ph2[0].Name != "(start)" {
		t.Errorf("an empty run: %v, %v; want only (start)", ph2, err)
	}
}
