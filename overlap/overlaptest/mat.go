package overlaptest

// mat is a row-major float64 matrix: the reference side of the suite.
type mat struct {
	r, c int
	v    []float64
}

func zeros(r, c int) mat { return mat{r, c, make([]float64, r*c)} }

func (m mat) at(i, j int) float64 { return m.v[i*m.c+j] }

// t is the transpose.
func (m mat) t() mat {
	o := zeros(m.c, m.r)
	for i := range m.r {
		for j := range m.c {
			o.v[j*m.r+i] = m.at(i, j)
		}
	}
	return o
}

// rows is rows [lo, hi).
func (m mat) rows(lo, hi int) mat {
	return mat{hi - lo, m.c, append([]float64(nil), m.v[lo*m.c:hi*m.c]...)}
}

// stack appends o's rows below m's.
func (m mat) stack(o mat) mat {
	return mat{m.r + o.r, o.c, append(append([]float64(nil), m.v...), o.v...)}
}

func (m mat) add(o mat) mat {
	out := zeros(m.r, m.c)
	for i := range m.v {
		out.v[i] = m.v[i] + o.v[i]
	}
	return out
}

// matmul is a·b, or a·bᵀ when transB.
func matmul(a, b mat, transB bool) mat {
	if transB {
		b = b.t()
	}
	o := zeros(a.r, b.c)
	for i := range a.r {
		for k := range a.c {
			x := a.at(i, k)
			for j := range b.c {
				o.v[i*b.c+j] += x * b.at(k, j)
			}
		}
	}
	return o
}
