package worker

import (
	"context"
	"testing"
	"time"

	"github.com/odmoe/odmoe/model"
)

// TestHostTiersAdmitAnExpertOnItsSecondLoad: a first load leaves only the
// compressed copy, a second one (while the first is remembered) earns the
// decompressed copy; a load forgotten behind ghostLen others starts over.
func TestHostTiersAdmitAnExpertOnItsSecondLoad(t *testing.T) {
	ti := newHostTiers(0)
	k := slotKey{1, 2}
	if ti.admit(k, 100) {
		t.Fatal("admitted on its first load")
	}
	if !ti.admit(k, 100) {
		t.Fatal("not admitted on its second load")
	}
	if ti.admit(k, 100) {
		t.Fatal("admitted again without being loaded twice more")
	}
	for e := range ghostLen {
		ti.admit(slotKey{0, e}, 100)
	}
	if ti.admit(k, 100) {
		t.Fatalf("admitted after %d other loads pushed it out of the ghost list", ghostLen)
	}
	if len(ti.inGhost) > ghostLen || ti.ghost.Len() > ghostLen {
		t.Fatalf("ghost list of %d (%d indexed), bound %d", ti.ghost.Len(), len(ti.inGhost), ghostLen)
	}
}

// TestHostTiersKeepCompressedWhenDecompressingIsCheap: when decompressing
// measures under a quarter of the transfer of the same bytes, no expert
// earns a decompressed copy, however often it loads; when it costs more,
// reuse decides again.
func TestHostTiersKeepCompressedWhenDecompressingIsCheap(t *testing.T) {
	ti := newHostTiers(1e9)                      // 1 GB/s: 1 ms per MB
	ti.decompressed(1<<20, 100*time.Microsecond) // 0.1 ms per MB
	k := slotKey{0, 1}
	for i := range 4 {
		if ti.admit(k, 1<<20) {
			t.Fatalf("load %d admitted though decompressing costs a tenth of the transfer", i+1)
		}
	}
	for range 100 {
		ti.decompressed(1<<20, 5*time.Millisecond) // now 5 ms per MB
	}
	ti.admit(k, 1<<20)
	if !ti.admit(k, 1<<20) {
		t.Fatal("not admitted on its second load once decompressing costs more than the transfer")
	}
}

// TestEngineWithBothHostTiers: with a host cache and a compressed tier,
// an expert's first load leaves no decompressed copy, its second earns one
// and its third is a host-cache hit; every load computes local mode's bits
// and only the first reads the store file.
func TestEngineWithBothHostTiers(t *testing.T) {
	e, st, mem, f := compressedTierEngine(t)
	chunks, h := e.Chunks, f.model.Config.HiddenSize
	e.Host = newHostCache(t, 64<<20)
	e.chooseTiers(st, 0)
	x := randomInput(1, h, 8)
	out := make([]float32, h)
	for i := range 3 {
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 2, 5, x, 1, out, Evict); err != nil {
			t.Fatal(err)
		}
		if !sameBits(out, localExpert(f.model, 2, 5, x, 1)) {
			t.Fatalf("load %d: not local mode's bits", i+1)
		}
		_, _, held := e.Host.Stats()
		if (held > 0) != (i >= 1) {
			t.Fatalf("after load %d the host cache holds %d bytes", i+1, held)
		}
	}
	hostHits, _, _ := e.Host.Stats()
	chunkHits, chunkMisses, chunkBytes := chunks.Stats()
	if chunkBytes != 0 || mem.InUse() != 0 {
		t.Errorf("the compressed tier still holds %d bytes (%d lent by its arena) of an expert the decompressed tier holds", chunkBytes, mem.InUse())
	}
	if hostHits != 1 || chunkMisses == 0 || chunkHits != chunkMisses {
		t.Fatalf("host cache hits %d (want 1: the third load); chunk reads from RAM %d, from the store %d (want equal: the second load from RAM)",
			hostHits, chunkHits, chunkMisses)
	}
}
