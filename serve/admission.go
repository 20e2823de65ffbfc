package serve

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
)

// admission lets at most batch sequences generate at once and at most
// queue more requests wait for a place; a request beyond both is refused
// at once rather than left to time out.
type admission struct {
	slots          chan struct{}
	queue          int64
	running, waits atomic.Int64
}

func newAdmission(batch, queue int) *admission {
	return &admission{slots: make(chan struct{}, batch), queue: int64(queue)}
}

// acquire waits for a place; release gives it back.
func (a *admission) acquire(ctx context.Context) (release func(), err error) {
	release = func() {
		a.running.Add(-1)
		<-a.slots
	}
	select {
	case a.slots <- struct{}{}:
		a.running.Add(1)
		return release, nil
	default:
	}
	if a.waits.Add(1) > a.queue {
		a.waits.Add(-1)
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "server_busy",
			Message: fmt.Sprintf("the server is busy: %d requests generating (-max-batch) and %d waiting (-max-queue); retry later", cap(a.slots), a.queue)}
	}
	defer a.waits.Add(-1)
	select {
	case a.slots <- struct{}{}:
		a.running.Add(1)
		return release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
