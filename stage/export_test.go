package stage

// SetMaxRunBytes makes runs carry at most n bytes of hidden state (so
// that a test's short prompts go in several), until the func it returns
// is called.
func SetMaxRunBytes(n int) func() {
	was := maxRunBytes
	maxRunBytes = n
	return func() { maxRunBytes = was }
}
