package worker

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/sched"
	"github.com/rs/zerolog"
)

// TestFillProgressSaysHowFarAndHowLong: a fill's progress lines say the
// bytes done of the share, the rate and the time left, at most once a
// period, and none at the end (which has its own).
func TestFillProgressSaysHowFarAndHowLong(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	start := time.Now().Add(-10 * time.Second)
	p := fillProgress(start, time.Hour, log)
	p(100<<20, 400<<20) // 10 s into a period of an hour
	if buf.Len() != 0 {
		t.Fatalf("a line within the period: %s", buf.String())
	}
	p = fillProgress(start, time.Second, log)
	p(100<<20, 400<<20) // 10 MiB/s: 30 s left
	line := buf.String()
	for _, want := range []string{`"done":"100.0 MiB"`, `"share":"400.0 MiB"`, `"rate":"10.0 MiB/s"`, `"left":30000`, "filling its share"} {
		if !strings.Contains(line, want) {
			t.Errorf("the progress line lacks %s: %s", want, line)
		}
	}
	buf.Reset()
	p(200<<20, 400<<20) // within a second of the last line
	p(400<<20, 400<<20) // the end
	if buf.Len() != 0 {
		t.Fatalf("lines within the period or at the end: %s", buf.String())
	}
}

// TestEveryChunkHasOneOwnerThatHoldsIt: in layouts of one to four
// workers a group, every chunk of every expert has one owner, a worker
// that holds the expert (its share: sched.Layout.Holds), and the workers
// of a group own about as many chunks each.
func TestEveryChunkHasOneOwnerThatHoldsIt(t *testing.T) {
	const layers, experts, chunks = 6, 16, 6
	for _, shape := range []struct{ workers, group int }{{4, 1}, {4, 2}, {8, 4}, {6, 3}} {
		l, err := sched.NewLayout(shape.workers, shape.group)
		if err != nil {
			t.Fatal(err)
		}
		owned := make([]int, shape.workers)
		for layer := range layers {
			for e := range experts {
				for k := range chunks {
					o := fillOwner(l, layer, e, k)
					if o < 0 || o >= shape.workers || !l.Holds(o, layer, e) {
						t.Fatalf("%+v: worker %d owns layer %d expert %d chunk %d: it does not hold the expert", shape, o, layer, e, k)
					}
					owned[o]++
				}
			}
		}
		for g := range l.Groups() {
			lo, hi := owned[g*l.Group], owned[g*l.Group]
			for q := range l.Group {
				lo, hi = min(lo, owned[g*l.Group+q]), max(hi, owned[g*l.Group+q])
			}
			if float64(hi) > 1.1*float64(lo) {
				t.Fatalf("%+v: group %d's members own %v chunks: want about as many each", shape, g, owned[g*l.Group:(g+1)*l.Group])
			}
		}
	}
}
