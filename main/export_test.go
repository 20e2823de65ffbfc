package mainnode

// RejoinReady reports whether a lost worker's new connection waits to
// rejoin at the next forward pass.
func (s *Swarm) RejoinReady() bool { return s.rejoins.Load() > 0 }
