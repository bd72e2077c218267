package eptest

import "fmt"

// Scenario is one routing shape of the suite. Over an EP group of P ranks
// it has Experts(P) experts; token-group rank q brings Tokens(step, q)
// tokens of Cols features, each choosing TopK distinct experts at random
// among those not starved.
type Scenario struct {
	Name string
	// LocalExperts is the least number of experts per EP rank; MinExperts
	// raises the total to the smallest multiple of P at or above it.
	LocalExperts, MinExperts int
	TopK                     int
	// CapacityFactor 0 is dropless; otherwise each expert keeps
	// ceil(CF·T·K/E) slots of the T tokens of the token group, in
	// token-group order (layers.RoutingPlan's rule).
	CapacityFactor float64
	Cols           int
	// Favour, when ≥ 0, is an expert every token chooses (every even
	// token with top-1), at a random position among its K, so that it
	// overflows a capacity.
	Favour int
	// Starve are experts no token chooses; StarveLastRank starves every
	// expert of the last EP rank, which then receives no row (P > 1 only).
	Starve         []int
	StarveLastRank bool
	// Tokens per token-group rank: MinTokens + (5q + 3·step) mod Spread.
	MinTokens, Spread int
}

func (sc Scenario) String() string { return sc.Name }

// Experts is the number of experts over an EP group of P ranks.
func (sc Scenario) Experts(P int) int {
	l := max(sc.LocalExperts, (sc.MinExperts+P-1)/P, 1)
	return P * l
}

// Tokens is the number of tokens token-group rank q brings to step step
// (uneven over the ranks; step 1 differs from step 0 on every rank).
func (sc Scenario) Tokens(step, q int) int {
	return sc.MinTokens + (5*q+3*step)%max(sc.Spread, 1)
}

// Applies says whether the scenario runs over an EP group of P ranks.
func (sc Scenario) Applies(P int) bool { return !sc.StarveLastRank || P > 1 }

// allowed are the experts a token may choose.
func (sc Scenario) allowed(E, P int) []int {
	starved := map[int]bool{}
	for _, e := range sc.Starve {
		starved[e%E] = true
	}
	if sc.StarveLastRank {
		for e := E - E/P; e < E; e++ {
			starved[e] = true
		}
	}
	var out []int
	for e := range E {
		if !starved[e] {
			out = append(out, e)
		}
	}
	return out
}

// Scenarios are the suite's routing shapes: dropless and capacity factors
// 1 and 1.5 (with drops, and with whole token-group ranks whose slots are
// all dropped), top-1, 2 and 8, experts with no token, an EP rank that
// receives no row, uneven tokens per rank, ranks that bring no token
// (Layout takes tokens ≥ 0; the MoE layer itself refuses an empty input),
// and row widths that are not multiples of 8.
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "dropless-top2", LocalExperts: 2, TopK: 2, Cols: 12, Favour: -1, MinTokens: 3, Spread: 6},
		{Name: "cf1-top1", LocalExperts: 2, MinExperts: 8, TopK: 1, CapacityFactor: 1, Cols: 10, Favour: 0, MinTokens: 3, Spread: 6},
		{Name: "cf1.5-top2", LocalExperts: 2, MinExperts: 8, TopK: 2, CapacityFactor: 1.5, Cols: 9, Favour: 1, MinTokens: 4, Spread: 4},
		{Name: "cf1-top2", LocalExperts: 3, TopK: 2, CapacityFactor: 1, Cols: 7, Favour: -1, MinTokens: 5, Spread: 4},
		{Name: "dropless-top8", LocalExperts: 1, MinExperts: 12, TopK: 8, Cols: 6, Favour: -1, MinTokens: 2, Spread: 4},
		{Name: "cf1-top8", LocalExperts: 1, MinExperts: 16, TopK: 8, CapacityFactor: 1, Cols: 5, Favour: 2, MinTokens: 3, Spread: 4},
		{Name: "starved-experts", LocalExperts: 3, TopK: 2, Cols: 11, Favour: -1, Starve: []int{1, 4}, MinTokens: 3, Spread: 4},
		{Name: "zero-tokens", LocalExperts: 2, TopK: 2, Cols: 5, Favour: -1, MinTokens: 0, Spread: 4},
		{Name: "empty-rank", LocalExperts: 2, TopK: 2, CapacityFactor: 1.5, Cols: 8, Favour: -1, StarveLastRank: true, MinTokens: 3, Spread: 6},
	}
}

// check validates the scenario over an EP group of P ranks.
func (sc Scenario) check(P int) error {
	E := sc.Experts(P)
	if sc.TopK < 1 || sc.TopK > len(sc.allowed(E, P)) || sc.Cols < 1 || sc.MinTokens < 0 || sc.Favour >= E {
		return fmt.Errorf("scenario %s over EP %d: top-%d of %d choosable experts (favourite %d), %d columns, at least %d tokens per rank: expected 1 ≤ K ≤ the choosable experts, a favourite below %d, and positive sizes (tokens may be 0)",
			sc.Name, P, sc.TopK, len(sc.allowed(E, P)), sc.Favour, sc.Cols, sc.MinTokens, E)
	}
	return nil
}
