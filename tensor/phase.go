package tensor

// PhaseMarker is an optional method of a backend that can time the work it
// queues: MarkPhase(name) says that phase name starts at this point of the
// queued work (in stream order on a GPU) and the phase before it ends
// there. Layers mark their phases through MarkPhase, which a backend
// without the method ignores; the CUDA backend records marks only while a
// phase timer runs (cudabackend.(*Backend).StartPhases), so an unwatched
// mark costs an interface check.
type PhaseMarker interface {
	MarkPhase(name string) // the phase name starts after the work queued so far
}

// MarkPhase marks the start of phase name on b when b is a PhaseMarker,
// and does nothing otherwise.
func MarkPhase(b Backend, name string) {
	if m, ok := b.(PhaseMarker); ok {
		m.MarkPhase(name)
	}
}

// PhaseOther is the phase a layer marks where its own phases end, so that
// the work queued after it until the next mark is not counted as the
// layer's last phase.
const PhaseOther = "other"
