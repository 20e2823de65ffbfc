package shadow

import (
	"fmt"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/sched"
)

// TestOwnerHintsGiveEachOwnerItsExperts: with experts resident on their
// owners, a prediction is split by owner, each hinted once with the
// experts it owns, in id order.
func TestOwnerHintsGiveEachOwnerItsExperts(t *testing.T) {
	owners, err := sched.NewPlacement(4, []int{0, 2}, 8)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	ownerHints(owners, 2, []int{0, 1, 2, 4, 6}, nil, func(w int, experts []int) {
		for _, e := range experts {
			if owners.Owner(2, e) != w {
				t.Errorf("expert %d hinted to w%d, owned by w%d", e, w, owners.Owner(2, e))
			}
		}
		got = append(got, fmt.Sprintf("w%d%v", w, experts))
	})
	// layer 2: owner (e+2) mod 4: e0 -> w2, e1 -> w3, e2 -> w0, e4 -> w2, e6 -> w0
	want := []string{"w2[0 4]", "w3[1]", "w0[2 6]"}
	if !slices.Equal(got, want) {
		t.Fatalf("hints %v, want %v", got, want)
	}
}
