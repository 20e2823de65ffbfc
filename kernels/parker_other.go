//go:build !linux

package kernels

// parker holds one goroutine asleep until another wakes it. Off Linux it
// is a channel of capacity 1: a wake before the sleep is kept, and the
// next sleep returns at once.
type parker struct{ token chan struct{} }

// init readies the parker before its first use.
func (p *parker) init() { p.token = make(chan struct{}, 1) }

// sleep returns once a wake is (or was) given, consuming it.
func (p *parker) sleep() { <-p.token }

// wake gives the token, if it is not already given.
func (p *parker) wake() {
	select {
	case p.token <- struct{}{}:
	default:
	}
}
