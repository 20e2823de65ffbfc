package tokenizer

// minHeap is a binary min-heap of items that order themselves; the BPE
// encoder keeps merge candidates in one, the trainer pair counts.
type minHeap[T interface{ less(T) bool }] []T

func (h *minHeap[T]) push(x T) {
	*h = append(*h, x)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q[i].less(q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *minHeap[T]) pop() T {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		l, r, small := 2*i+1, 2*i+2, i
		if l < len(q) && q[l].less(q[small]) {
			small = l
		}
		if r < len(q) && q[r].less(q[small]) {
			small = r
		}
		if small == i {
			break
		}
		q[i], q[small] = q[small], q[i]
		i = small
	}
	*h = q
	return top
}
