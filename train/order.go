package train

import "math/rand/v2"

// permutation is a pseudo-random permutation of [0, n), computed one
// index at a time: a balanced Feistel network of feistelRounds rounds over
// 2h bits (the fewest even number with 2^2h ≥ n, at least 2), whose
// results ≥ n are passed through it again until one falls below n (cycle
// walking: the cycle of a number below n returns below n, so this is a
// bijection of [0, n), in fewer than 4 passes on average). Its round keys
// come from a PCG stream seeded by (seed, epoch), so an epoch's order is a
// function of those alone; it holds nothing per index.
type permutation struct {
	n    uint64
	half uint   // bits of each half
	mask uint64 // 2^half − 1
	keys [feistelRounds]uint64
}

const feistelRounds = 6

func newPermutation(n int, seed uint64, epoch int) permutation {
	bits := uint(2)
	for bits < 64 && uint64(1)<<bits < uint64(n) {
		bits += 2
	}
	rng := rand.New(rand.NewPCG(seed, uint64(epoch)*0x9e3779b97f4a7c15+0xd1b54a32d192ed03))
	p := permutation{n: uint64(n), half: bits / 2, mask: 1<<(bits/2) - 1}
	for i := range p.keys {
		p.keys[i] = rng.Uint64()
	}
	return p
}

// at is the image of i, in [0, n).
func (p *permutation) at(i int) int {
	x := uint64(i)
	for {
		l, r := x>>p.half, x&p.mask
		for _, k := range p.keys {
			l, r = r, l^(mix64(r^k)&p.mask)
		}
		x = l<<p.half | r
		if x < p.n {
			return int(x)
		}
	}
}

// mix64 is SplitMix64's finaliser: every bit of the result depends on
// every bit of z.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
