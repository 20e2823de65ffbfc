package simrig

import (
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/testbed"
)

// TestARigsOwnFlagsSetTheSimulatedLayoutAndLead: the main node's -group
// ("-group V" or "-group=V", the last setting counting, as for the node
// itself) and the shadow's -ahead (its default when unset) are read as
// the nodes read them; a value that is not a number is an error naming
// the node.
func TestARigsOwnFlagsSetTheSimulatedLayoutAndLead(t *testing.T) {
	rig := &testbed.Rig{Main: testbed.Node{Name: "main", Flags: []string{"-group", "4", "-group=2"}}, Workers: make([]testbed.Node, 4),
		Shadow: &testbed.Node{Name: "shadow"}}
	if l, err := rigLayout(rig, model.Config{TopK: 4}); err != nil || l.Group != 2 {
		t.Fatalf("-group: %+v, %v; want groups of 2 (the last)", l, err)
	}
	if a, err := shadowAhead(rig); err != nil || a != 1 {
		t.Fatalf("-ahead unset: %v, %v; want the default 1", a, err)
	}
	rig.Main.Flags = nil
	if l, err := rigLayout(rig, model.Config{TopK: 4}); err != nil || l.Group != 4 {
		t.Fatalf("-group unset: %+v, %v; want the model's top-k, 4", l, err)
	}
	rig.Main.Flags = []string{"-group", "two"}
	if _, err := rigLayout(rig, model.Config{TopK: 4}); err == nil || !strings.Contains(err.Error(), "main") {
		t.Fatalf("-group two: %v; want an error naming the node", err)
	}
}
