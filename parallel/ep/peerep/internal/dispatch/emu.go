//go:build asynctp_emu

package dispatch

// SetFusedLandEarly says whether the fused expert path's backend stream
// lands the sources whose tokens are already here before the GEMM (the
// default) or leaves every source to the side stream's wait-and-land, so
// that the emulator's tests run both (the emulated ranks meet at a barrier
// before each wait, so every source is already here). Not safe while a
// step runs.
func SetFusedLandEarly(on bool) { fusedLandEarly = on }

// SetFusedSideSend says whether the fused expert path's combine (and
// backward dispatch) sends blocks from the side stream beside the GEMM
// (the default) or leaves every block to the launch after the GEMM. In
// the emulator the GEMM runs first, so with it on the side launch sends
// everything and the later one nothing. Not safe while a step runs.
func SetFusedSideSend(on bool) { fusedSideSend = on }
