package corpus

import (
	"math/rand/v2"
	"strings"
)

var (
	subjects   = []string{"the engineer", "a small robot", "the old teacher", "my neighbour", "the river pilot", "a tired student", "the baker", "our captain", "the gardener", "a quiet child", "the night guard", "the doctor"}
	adjectives = []string{"long", "green", "broken", "quiet", "heavy", "bright", "strange", "warm", "narrow", "empty", "golden", "simple"}
	objects    = []string{"letter", "bridge", "garden", "lamp", "map", "boat", "window", "song", "machine", "road", "book", "clock"}
	verbs      = []string{"reads", "builds", "paints", "finds", "carries", "repairs", "watches", "follows", "opens", "remembers", "draws", "counts"}
	places     = []string{"near the river", "in the morning", "under the old tree", "at the station", "before the storm", "after dinner", "by the window", "on the hill", "in the market", "behind the school"}
	linkers    = []string{"and then", "because", "while", "but", "so"}
	pronouns   = []string{"she", "he", "they", "it", "we"}
	endings    = []string{"smiles", "waits", "sings", "goes home", "sleeps", "laughs", "writes it down", "looks again"}
)

// Default returns the default corpus: about size bytes of text, the same on
// every call.
func Default() []byte { return Generate(7, 300_000) }

// Generate returns about n bytes of grammar text from seed.
func Generate(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0xa5a5a5a5))
	pick := func(list []string) string { return list[rng.IntN(len(list))] }
	var b strings.Builder
	b.Grow(n + 256)
	for b.Len() < n {
		for range 3 + rng.IntN(4) { // a paragraph of a few sentences
			s := pick(subjects) + " " + pick(verbs) + " the " + pick(adjectives) + " " + pick(objects) + " " + pick(places)
			if rng.IntN(3) == 0 {
				s += ", " + pick(linkers) + " " + pick(pronouns) + " " + pick(endings)
			}
			b.WriteString(strings.ToUpper(s[:1]) + s[1:] + ". ")
		}
		b.WriteString("\n\n")
	}
	return []byte(b.String())
}
