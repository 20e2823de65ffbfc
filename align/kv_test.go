package align

import (
	"math"
	"reflect"
	"testing"

	"github.com/odmoe/odmoe/kvcache"
)

func fill(c *kvcache.Cache, n int, seed float32) {
	c.Reserve(n)
	row := make([]float32, c.Width())
	for p := range n {
		for l := range c.Layers() {
			for i := range row {
				row[i] = seed + float32(l)*0.5 + float32(p)*0.25 + float32(i)/64
			}
			c.Put(l, p, row, row)
		}
	}
	c.Commit(n)
}

// TestKVAlignmentOverwritesOnlyNewRows: the main node's rows [4, 7) land in
// the shadow's cache in fp16 precision; older rows stay the shadow's own.
func TestKVAlignmentOverwritesOnlyNewRows(t *testing.T) {
	mainCache, shadow := kvcache.New(3, 2, 8, 8), kvcache.New(3, 2, 8, 8)
	fill(mainCache, 7, 1)
	fill(shadow, 5, -3) // the shadow ran ahead on its own, differently
	kv, err := PackKV(mainCache, 4, 7)
	if err != nil {
		t.Fatal(err)
	}
	if kv.Rows != 3 || len(kv.Keys[2]) != 3*16 {
		t.Fatalf("packed %d rows, %d values", kv.Rows, len(kv.Keys[2]))
	}
	if err := kv.Apply(shadow); err != nil {
		t.Fatal(err)
	}
	if shadow.Len() != 7 {
		t.Fatalf("shadow cache has %d positions, want 7", shadow.Len())
	}
	w := shadow.Width()
	for l := range 3 {
		got, want := shadow.Keys(l, 7), mainCache.Keys(l, 7)
		for p := range 7 {
			for i := range w {
				g, m := got[p*w+i], want[p*w+i]
				if p >= 4 && math.Abs(float64(g-m)) > math.Abs(float64(m))/1024 {
					t.Fatalf("layer %d pos %d: %v, main %v (beyond fp16 rounding)", l, p, g, m)
				}
				if p < 4 && g == m {
					t.Fatalf("layer %d pos %d was overwritten", l, p)
				}
			}
		}
	}
}

func TestKVAlignmentRefusesMismatches(t *testing.T) {
	c := kvcache.New(2, 1, 4, 4)
	fill(c, 2, 0)
	if _, err := PackKV(c, 1, 3); err == nil {
		t.Error("rows past the cache accepted")
	}
	kv, _ := PackKV(c, 0, 2)
	if err := kv.Apply(kvcache.New(3, 1, 4, 4)); err == nil {
		t.Error("rows for 2 layers applied to a 3-layer cache")
	}
	gap := kv
	gap.From = 5
	if err := gap.Apply(kvcache.New(2, 1, 4, 4)); err == nil {
		t.Error("rows leaving a gap accepted")
	}
}

// TestKVAlignmentOfALatentCache: a latent cache's rows travel once (no
// value rows) and land in the shadow's latent cache as keys and values;
// a latent payload is refused by a key-and-value cache and the other way
// round.
func TestKVAlignmentOfALatentCache(t *testing.T) {
	mainCache, shadow := kvcache.NewLatent(3, 10, 8), kvcache.NewLatent(3, 10, 8)
	fill(mainCache, 6, 1)
	fill(shadow, 2, -3)
	kv, err := PackKV(mainCache, 2, 6)
	if err != nil {
		t.Fatal(err)
	}
	if kv.Values != nil || len(kv.Keys[1]) != 4*10 {
		t.Fatalf("a latent payload of %d key values and values %v", len(kv.Keys[1]), kv.Values)
	}
	if err := kv.Apply(shadow); err != nil {
		t.Fatal(err)
	}
	for l := range 3 {
		want, got := mainCache.Keys(l, 6), shadow.Values(l, 6)
		for i := 2 * 10; i < 6*10; i++ {
			if math.Abs(float64(got[i]-want[i])) > 1e-2 {
				t.Fatalf("layer %d value %d: %v, the main node's %v", l, i, got[i], want[i])
			}
		}
	}
	if err := kv.Apply(kvcache.New(3, 1, 10, 8)); err == nil {
		t.Fatal("a latent payload applied to a key-and-value cache")
	}
	full := kvcache.New(3, 1, 10, 8)
	fill(full, 3, 1)
	other, _ := PackKV(full, 0, 3)
	if err := other.Apply(kvcache.NewLatent(3, 10, 8)); err == nil {
		t.Fatal("a key-and-value payload applied to a latent cache")
	}
}

// TestKVRowsReachAStagesLayers: the main node's rows of three layers,
// through their wire form, land in a stage holding layer 1 only (its
// share) as in the whole cache; a stage's cache packs its own layers;
// rows that miss one of a cache's layers are refused.
func TestKVRowsReachAStagesLayers(t *testing.T) {
	mainCache, whole, stage := kvcache.New(3, 2, 8, 8), kvcache.New(3, 2, 8, 8), kvcache.New(3, 2, 8, 0)
	if err := stage.SetLayers(1, 2); err != nil {
		t.Fatal(err)
	}
	fill(mainCache, 5, 1)
	kv, err := PackKV(mainCache, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	keys, values := kv.Layers(1, 3).Tensors()
	back, err := FromTensors(0, 1, keys, values)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Apply(whole); err != nil {
		t.Fatal(err)
	}
	if err := back.Apply(stage); err != nil {
		t.Fatal(err)
	}
	for i, x := range stage.Keys(1, 5) {
		if x != whole.Keys(1, 5)[i] || stage.Values(1, 5)[i] != whole.Values(1, 5)[i] {
			t.Fatalf("position %d: the stage's layer 1 differs from the whole cache's", i/8)
		}
	}
	own, err := PackKV(stage, 2, 5)
	if err != nil || own.First != 1 || len(own.Keys) != 1 {
		t.Fatalf("a stage's rows: first layer %d, %d layers, %v", own.First, len(own.Keys), err)
	}
	if err := kv.Layers(2, 3).Apply(stage); err == nil {
		t.Fatal("rows of layer 2 applied to a stage of layer 1")
	}
}

// TestKVRowsJoinAcrossStagesAndPositions: a cache's rows cut by layers
// (a node's own and its stages') and by positions (run after run) join
// back to the rows packed whole; rows of another width, or of layers that
// do not follow, do not join.
func TestKVRowsJoinAcrossStagesAndPositions(t *testing.T) {
	c := kvcache.New(4, 2, 8, 0)
	fill(c, 6, 1)
	whole, err := PackKV(c, 1, 6)
	if err != nil {
		t.Fatal(err)
	}
	joined, err := JoinLayers(KVRows{}, whole.Layers(0, 1), whole.Layers(1, 3), whole.Layers(3, 4))
	if err != nil || !reflect.DeepEqual(joined, whole) {
		t.Fatalf("joined by layers: %v, equal %v", err, reflect.DeepEqual(joined, whole))
	}
	part := whole.Positions(2, 4)
	want, err := PackKV(c, 2, 4)
	if err != nil || !reflect.DeepEqual(part, want) {
		t.Fatalf("positions 2-3: %v, equal %v", err, reflect.DeepEqual(part, want))
	}
	if _, err := JoinLayers(whole.Layers(0, 1), whole.Layers(2, 3)); err == nil {
		t.Fatal("layers 0 and 2 joined")
	}
	if _, err := JoinLayers(whole.Layers(0, 1), part.Layers(1, 2)); err == nil {
		t.Fatal("rows of other positions joined")
	}
	if _, err := JoinLayers(KVRows{}); err == nil {
		t.Fatal("nothing joined")
	}
}
