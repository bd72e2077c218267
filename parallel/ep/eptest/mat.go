package eptest

// mat is a row-major float64 matrix: the reference side of the suite.
type mat struct {
	r, c int
	v    []float64
}

func zeros(r, c int) mat { return mat{r, c, make([]float64, r*c)} }

func (m mat) at(i, j int) float64 { return m.v[i*m.c+j] }

func (m mat) row(i int) []float64 { return m.v[i*m.c : (i+1)*m.c] }

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// absDot is Σ |a_i·b_i|, the scale of dot(a, b)'s rounding error.
func absDot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += abs(a[i] * b[i])
	}
	return s
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}
