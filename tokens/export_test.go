package tokens

// CanMap is canMap for the external tests.
const CanMap = canMap

// SetMapFiles chooses mapping (true, where the system maps) or reading
// whole and returns the choice before.
func SetMapFiles(m bool) bool {
	old := mapFiles
	mapFiles = m && canMap
	return old
}
