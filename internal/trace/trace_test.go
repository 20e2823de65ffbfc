package trace

import (
	"path/filepath"
	"testing"
	"time"
)

func TestRecorderKeepsOnlyItsWindowAndRestarts(t *testing.T) {
	var nilRec *Recorder
	nilRec.Span(Main, 1, 0, -1, time.Now(), time.Now()) // a nil recorder records nothing, safely
	if nilRec.Active(1) {
		t.Fatal("nil recorder active")
	}
	r := NewRecorder("main")
	t0 := time.Unix(100, 0)
	r.Span(Main, 2, 0, -1, t0, t0.Add(time.Millisecond))
	if ev, _ := r.Events(); len(ev) != 0 || r.Active(2) {
		t.Fatalf("recorded %d events before any window", len(ev))
	}
	r.Window(2, 3)
	for it := int64(1); it <= 4; it++ {
		r.Span(Main, it, 0, -1, t0, t0.Add(time.Millisecond))
		r.Message(Send, MsgActivation, "w1", it, 0, -1, uint64(it), t0)
	}
	ev, dropped := r.Events()
	if len(ev) != 4 || dropped != 0 || ev[0].Pass != 2 || ev[3].Pass != 3 || ev[0].Node != "main" {
		t.Fatalf("window 2..3 kept %+v", ev)
	}
	if ev[0].End-ev[0].Start != int64(time.Millisecond) || ev[1].Start != ev[1].End {
		t.Errorf("span or instant times wrong: %+v", ev[:2])
	}
	r.Window(1, 1) // a new sequence: what was recorded goes
	if ev, _ := r.Events(); len(ev) != 0 {
		t.Errorf("a new window kept %d old events", len(ev))
	}
}

func TestJoinPairsEachSendWithItsReceive(t *testing.T) {
	ev := []Event{
		{Node: "main", Kind: Send, Msg: MsgActivation, Peer: "w1", Pass: 2, Layer: 1, Expert: -1, ID: 7, Start: 100, End: 100},
		{Node: "main", Kind: Send, Msg: MsgActivation, Peer: "w2", Pass: 2, Layer: 1, Expert: -1, ID: 8, Start: 101, End: 101},
		{Node: "w1", Kind: Recv, Msg: MsgActivation, Peer: "main", Pass: 2, Layer: 1, Expert: -1, ID: 7, Start: 150, End: 150},
		{Node: "w2", Kind: Recv, Msg: MsgActivation, Peer: "main", Pass: 2, Layer: 1, Expert: -1, ID: 8, Start: 140, End: 140},
		{Node: "w1", Kind: Send, Msg: MsgResult, Peer: "main", Pass: 2, Layer: 1, Expert: 3, ID: 7, Start: 200, End: 200},
		{Node: "main", Kind: Recv, Msg: MsgResult, Peer: "w1", Pass: 2, Layer: 1, Expert: 3, ID: 7, Start: 260, End: 260},
		// a result for another expert of the same request, never received: left out
		{Node: "w1", Kind: Send, Msg: MsgResult, Peer: "main", Pass: 2, Layer: 1, Expert: 4, ID: 7, Start: 210, End: 210},
		// the shadow hints the same layer twice: paired in order
		{Node: "shadow", Kind: Send, Msg: MsgPrediction, Peer: "w1", Pass: 2, Layer: 2, Expert: -1, Start: 10, End: 10},
		{Node: "shadow", Kind: Send, Msg: MsgPrediction, Peer: "w1", Pass: 2, Layer: 2, Expert: -1, Start: 20, End: 20},
		{Node: "w1", Kind: Recv, Msg: MsgPrediction, Peer: "shadow", Pass: 2, Layer: 2, Expert: -1, Start: 35, End: 35},
		{Node: "w1", Kind: Recv, Msg: MsgPrediction, Peer: "shadow", Pass: 2, Layer: 2, Expert: -1, Start: 30, End: 30},
		{Node: "w1", Kind: Compute, Pass: 2, Layer: 1, Expert: 3, Start: 160, End: 190},
	}
	hops := Join(ev)
	want := []Hop{
		{From: "shadow", To: "w1", Msg: MsgPrediction, Pass: 2, Layer: 2, Expert: -1, Sent: 10, Received: 30},
		{From: "shadow", To: "w1", Msg: MsgPrediction, Pass: 2, Layer: 2, Expert: -1, Sent: 20, Received: 35},
		{From: "main", To: "w1", Msg: MsgActivation, Pass: 2, Layer: 1, Expert: -1, Sent: 100, Received: 150},
		{From: "main", To: "w2", Msg: MsgActivation, Pass: 2, Layer: 1, Expert: -1, Sent: 101, Received: 140},
		{From: "w1", To: "main", Msg: MsgResult, Pass: 2, Layer: 1, Expert: 3, Sent: 200, Received: 260},
	}
	if len(hops) != len(want) {
		t.Fatalf("%d hops, want %d: %+v", len(hops), len(want), hops)
	}
	for i := range want {
		if hops[i] != want[i] {
			t.Errorf("hop %d = %+v, want %+v", i, hops[i], want[i])
		}
	}
}

func TestReadFileRefusesABadEvent(t *testing.T) {
	dir := t.TempDir()
	good := &File{From: 2, To: 2, Layers: 1, Nodes: []string{"main"}, Events: []Event{{Node: "main", Kind: Main, Pass: 2, Expert: -1, Start: 1, End: 2}}}
	path := filepath.Join(dir, "t.json")
	if err := good.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(path)
	if err != nil || len(f.Events) != 1 || f.Events[0] != good.Events[0] {
		t.Fatalf("read back %+v, %v", f, err)
	}
	for _, bad := range []Event{
		{Node: "main", Kind: "XX", Start: 1, End: 2},
		{Node: "main", Kind: Main, Start: 3, End: 2},
		{Node: "main", Kind: Send, Start: 1, End: 1},
		{Kind: Main, Start: 1, End: 2},
	} {
		good.Events = []Event{bad}
		if err := good.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFile(path); err == nil {
			t.Errorf("event %+v accepted", bad)
		}
	}
}
