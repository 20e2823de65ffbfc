package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestFetchFillsAShareFromAWorker: `odmoe fetch` as worker w2 fills an
// empty directory with layers 0 and 2's experts from worker w1 (its store,
// over QUIC with mutual TLS): the share opens with the model's identity
// and reads as w1's; run again, it keeps every byte and fetches none.
func TestFetchFillsAShareFromAWorker(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := inproc.Generate(ctx, t.TempDir(), "tiny", 9, 2)
	if err != nil {
		t.Fatal(err)
	}
	addr, stop, err := inproc.StartWorker(ctx, f, 0, "127.0.0.1:0", inproc.WorkerOptions{BudgetBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := filepath.Join(t.TempDir(), "share")
	args := []string{"fetch", "-from", addr, "-store", dir, "-layers", "0-0,2-2", "-certs", f.Certs, "-name", "w2", "-log-level", "warn"}
	so, se, code := run(t, "", args...)
	if code != 0 || !strings.Contains(so, "0 B kept") {
		t.Fatalf("fetch exit %d:\n%s\n%s", code, so, se)
	}
	held, err := store.Open(f.Store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	share, err := store.Open(dir, store.Options{Identity: held.Identity()})
	if err != nil {
		t.Fatal(err)
	}
	defer share.Close()
	for _, l := range []int{0, 2} {
		for e := range held.Experts() {
			n, _ := held.ExpertBytes(l, e)
			want, got := make([]byte, n), make([]byte, n)
			if _, err := held.ReadExpert(ctx, l, e, want); err != nil {
				t.Fatal(err)
			}
			if _, err := share.ReadExpert(ctx, l, e, got); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("layer %d expert %d of the share: %v, or other bytes than w1's", l, e, err)
			}
		}
	}
	n, _ := held.ExpertBytes(1, 0)
	if _, err := share.ReadExpert(ctx, 1, 0, make([]byte, n)); !errors.Is(err, store.ErrChecksum) {
		t.Fatalf("layer 1, outside the share: %v, want a checksum error (never fetched)", err)
	}
	so, se, code = run(t, "", args...)
	if code != 0 || !strings.Contains(so, "0 B fetched") {
		t.Fatalf("fetch again: exit %d, want every byte kept and none fetched:\n%s\n%s", code, so, se)
	}
	t.Log(strings.TrimSpace(so))

	// a worker's share by its place in the layout: worker 1 of 2 in
	// groups of 1 runs layers 1 and 3 whole, and the odd experts of
	// layers 0 and 2 in prefill
	dir = filepath.Join(t.TempDir(), "w1")
	so, se, code = run(t, "", "fetch", "-from", addr, "-store", dir, "-worker", "1", "-workers", "2", "-group", "1", "-certs", f.Certs, "-name", "w2", "-log-level", "warn")
	if code != 0 {
		t.Fatalf("fetch -worker 1: exit %d:\n%s\n%s", code, so, se)
	}
	share2, err := store.Open(dir, store.Options{Identity: held.Identity()})
	if err != nil {
		t.Fatal(err)
	}
	defer share2.Close()
	for _, l := range held.Layers() {
		for e := range held.Experts() {
			n, _ := held.ExpertBytes(l, e)
			_, err := share2.ReadExpert(ctx, l, e, make([]byte, n))
			if in := l%2 == 1 || e%2 == 1; in != (err == nil) {
				t.Fatalf("worker 1's share, layer %d expert %d: read %v, want it there %v", l, e, err, in)
			}
		}
	}
	for _, bad := range [][]string{{"-worker", "2", "-workers", "2", "-group", "1"}, {"-worker", "0", "-workers", "3", "-group", "2"}, {"-workers", "2", "-group", "1"}} {
		_, se, code := run(t, "", append([]string{"fetch", "-from", addr, "-store", t.TempDir(), "-certs", f.Certs, "-name", "w2"}, bad...)...)
		if code != 2 || !strings.Contains(se, "-worker") {
			t.Errorf("fetch %v: exit %d, want a usage error naming -worker:\n%s", bad, code, se)
		}
	}
}

// TestAWorkerRunsOnItsShareAndFetchesTheRest: real processes on
// loopback: worker w4 starts with a share of the store (odmoe fetch
// -worker 3) and -fetch-from w1, w3 with an empty directory and
// -fetch-from w1; the main node's run is local mode's bit for bit, and
// w3's directory now holds the chunks it ran (fetched as first needed).
func TestAWorkerRunsOnItsShareAndFetchesTheRest(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes")
	}
	r := newChaosRig(t, 4)
	r.startWorker(0)
	r.startWorker(1)
	empty, share := filepath.Join(r.dir, "w3.store"), filepath.Join(r.dir, "w4.store")
	if so, se, code := run(t, "", "fetch", "-from", r.workers[0], "-store", share, "-worker", "3", "-workers", "4", "-group", "2",
		"-certs", filepath.Join(r.dir, "certs"), "-name", "w4", "-log-level", "warn"); code != 0 {
		t.Fatalf("fetch w4's share: exit %d\n%s\n%s\n%s", code, so, se, r.logs())
	}
	for i, dir := range map[int]string{2: empty, 3: share} {
		name := fmt.Sprintf("w%d", i+1)
		r.start(name, "run", "-role", "worker", "-listen", r.workers[i], "-store", dir, "-fetch-from", r.workers[0], "-certs", filepath.Join(r.dir, "certs"), "-name", name,
			"-device-mem", "64MiB", "-log-level", "info")
	}
	const n = "24"
	local, swarm := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	statsFile := filepath.Join(r.dir, "stats.json")
	if se, code := r.runMain("-prefetch", "reactive", "-n", n, "-ignore-eos", "-dump", swarm, "-stats", statsFile); code != 0 {
		t.Fatalf("main node: exit %d\n%s\n%s", code, se, r.logs())
	}
	sameDump(t, swarm, local)
	var stats struct {
		Workers []struct {
			StoreFetched, StoreServed int64
		} `json:"workers"`
	}
	if b, err := os.ReadFile(statsFile); err != nil || json.Unmarshal(b, &stats) != nil || len(stats.Workers) != 4 {
		t.Fatalf("the run's -stats: %v, %d workers", err, len(stats.Workers))
	}
	// (w2, holding the whole store, fetches nothing; it serves w3 the
	// chunks it owns of the experts w3 runs in prefill: worker.fillOwner)
	if w := stats.Workers; w[0].StoreServed == 0 || w[2].StoreFetched == 0 || w[1].StoreFetched != 0 || w[3].StoreServed == 0 {
		t.Fatalf("the workers' store bytes fetched and served: %+v; want w1 and w4 serving, w3 fetching, w2 fetching nothing", w)
	}
	held, err := store.Open(r.store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	filled, err := store.Open(empty, store.Options{Identity: held.Identity()})
	if err != nil {
		t.Fatal(err)
	}
	defer filled.Close()
	read := 0 // experts w3 ran, now in its directory
	for _, l := range held.Layers() {
		for e := range held.Experts() {
			nb, _ := held.ExpertBytes(l, e)
			if _, err := filled.ReadExpert(context.Background(), l, e, make([]byte, nb)); err == nil {
				read++
			}
		}
	}
	if read == 0 {
		t.Fatalf("w3's directory holds no expert after the run\n%s", r.logOf("w3"))
	}
	t.Logf("w3 kept %d of %d experts it fetched while running", read, len(held.Layers())*held.Experts())
}

// TestASwarmStartsFromEmptyWorkersAndTheMainNodesStore: real processes
// on loopback: four workers started on empty directories with
// -fetch-from the main node's -store-listen address, before the main
// node is up; the main node serves its store, the workers take the
// index from it, then what each runs as it runs it, then the rest of its
// share, its group's other member's part from that member: the run is
// local mode's bit for bit, every worker fetched, and workers served
// each other.
func TestASwarmStartsFromEmptyWorkersAndTheMainNodesStore(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes")
	}
	r := newChaosRig(t, 4)
	storeAddr := freeLoopbackAddr(t)
	r.startFetchingWorkers(storeAddr)
	const n = "16"
	local, swarm := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	statsFile := filepath.Join(r.dir, "stats.json")
	se, code := r.runMain("-prefetch", "oracle-next", "-n", n, "-ignore-eos", "-dump", swarm, "-stats", statsFile, "-store", r.store, "-store-listen", storeAddr, "-log-level", "info")
	if code != 0 {
		t.Fatalf("main node: exit %d\n%s\n%s", code, se, r.logs())
	}
	sameDump(t, swarm, local)
	var stats struct {
		Workers []struct{ StoreFetched, StoreServed int64 } `json:"workers"`
	}
	if b, err := os.ReadFile(statsFile); err != nil || json.Unmarshal(b, &stats) != nil || len(stats.Workers) != 4 {
		t.Fatalf("the run's -stats: %v, %d workers", err, len(stats.Workers))
	}
	var served int64
	for i, w := range stats.Workers {
		if w.StoreFetched == 0 {
			t.Errorf("worker %d fetched nothing", i+1)
		}
		served += w.StoreServed
	}
	if served == 0 {
		t.Errorf("no worker served another: the members of a group fetch each other's part of their share from each other")
	}
	if !strings.Contains(se, "serving the checkpoint and the expert store") || strings.Count(se, "a worker's expert store, fetched and served") != 4 {
		t.Errorf("the main node's log does not say it served its store, and a line for each worker's fetches:\n%s", se)
	}
	// each worker, told its place, filled its whole share in the
	// background while the run went on
	held, err := store.Open(r.store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	layout, _ := sched.NewLayout(4, 2)
	for i := range r.workers {
		name := fmt.Sprintf("w%d", i+1)
		st, err := store.Open(filepath.Join(r.dir, name+".store"), store.Options{Identity: held.Identity()})
		if err != nil {
			t.Fatal(err)
		}
		missing := 0
		for _, l := range held.Layers() {
			for e := range held.Experts() {
				if !layout.Holds(i, l, e) {
					continue
				}
				nb, _ := held.ExpertBytes(l, e)
				if _, err := st.ReadExpert(context.Background(), l, e, make([]byte, nb)); err != nil {
					missing++
				}
			}
		}
		st.Close()
		if log := r.logOf(name); missing > 0 || !strings.Contains(log, "its share of the store filled") {
			t.Errorf("%s lacks %d experts of its share after the run, or did not fill it\n%s", name, missing, log)
		}
	}
}

// TestAShadowRelaysTheStoreToTheWorkers: real processes on loopback, a
// shadow and four workers started on empty directories with -fetch-from
// the main node's -store-listen, the shadow with -store: it serves the
// store to the workers as it fetches it (on the TCP port of its -listen;
// the main node tells the workers its address, wire.Place.Holders), and
// every worker takes chunks from it; the run is local mode's bit for bit.
func TestAShadowRelaysTheStoreToTheWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes")
	}
	r := newChaosRig(t, 4)
	storeAddr := freeLoopbackAddr(t)
	certs := filepath.Join(r.dir, "certs")
	r.startFetchingWorkers(storeAddr)
	r.start("shadow", "run", "-role", "shadow", "-model", filepath.Join(r.dir, "shadow.model"), "-store", filepath.Join(r.dir, "shadow.store"),
		"-fetch-from", storeAddr, "-quant", "int8", "-listen", r.shadow, "-workers", strings.Join(r.workers, ","), "-group", "2",
		"-certs", certs, "-name", "shadow", "-log-level", "info")
	const n = "16"
	local, swarm := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	se, code := r.runMain("-prefetch", "shadow", "-shadow", r.shadow, "-n", n, "-ignore-eos", "-dump", swarm, "-store", r.store, "-store-listen", storeAddr, "-log-level", "info")
	if code != 0 {
		t.Fatalf("main node: exit %d\n%s\n%s", code, se, r.logs())
	}
	sameDump(t, swarm, local)
	// each worker, its share filled, closes its stream to the shadow,
	// which says what it served it
	deadline := time.Now().Add(60 * time.Second)
	served := regexp.MustCompile(`a worker fetching from its store is done.*peer=(w\d).*served="([0-9.]+) ([KMG]i)?B"`)
	for {
		got := map[string]bool{}
		for _, m := range served.FindAllStringSubmatch(r.logOf("shadow"), -1) {
			if m[2] != "0" && m[2] != "0.0" {
				got[m[1]] = true
			}
		}
		if len(got) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shadow served chunks to %v, want every worker:\n%s\n%s", got, r.logOf("shadow"), r.logOf("w1"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log := r.logOf("w1"); !strings.Contains(log, "holders=") || !strings.Contains(log, r.shadow) {
		t.Errorf("w1 was not told the shadow holds the store:\n%s", log)
	}
}

// TestAStagedSwarmStartsFromEmptyDirectories: real processes on
// loopback, every node but the main node started on empty directories
// with -fetch-from the main node's -store-listen (the main node makes
// the store it serves, its -store empty too): two main stages, two
// shadow stages and four workers. The stages and shadow stages fetch
// their layers' tensors (the shadow stages with their experts, the first
// with the embedding and head), checked, and the run is local mode's bit
// for bit; a stage started again on what it fetched fetches nothing.
func TestAStagedSwarmStartsFromEmptyDirectories(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes")
	}
	r := newChaosRig(t, 4)
	certs := filepath.Join(r.dir, "certs")
	if _, se, code := run(t, "", "certs", "-out", certs, "-nodes", "stage1,stage2,shadow2", "-log-level", "warn"); code != 0 {
		t.Fatalf("certs: %s", se)
	}
	storeAddr := freeLoopbackAddr(t)
	workers := strings.Join(r.workers, ",")
	r.startFetchingWorkers(storeAddr)
	stages := []string{freeLoopbackAddr(t), freeLoopbackAddr(t)}
	shadow2 := freeLoopbackAddr(t)
	startStage := func(i int, layers string) {
		name := fmt.Sprintf("stage%d", i+1)
		// the stages tell the workers their place, and shadow2, which
		// relays its layers' chunks (-store)
		r.start(name, "run", "-role", "stage", "-model", filepath.Join(r.dir, name+".model"), "-fetch-from", storeAddr, "-layers", layers, "-listen", stages[i],
			"-workers", workers, "-group", "2", "-prefetch", "shadow", "-store-relays", shadow2, "-certs", certs, "-name", name, "-log-level", "info")
	}
	startStage(0, "0-1")
	startStage(1, "2-")
	// shadow2 takes its experts as the store's chunks (-store), the
	// first shadow stage as bf16 tensors
	startShadow2 := func() {
		r.start("shadow2", "run", "-role", "shadow", "-model", filepath.Join(r.dir, "shadow2.model"), "-store", filepath.Join(r.dir, "shadow2.store"), "-fetch-from", storeAddr,
			"-quant", "int8", "-layers", "2-", "-listen", shadow2, "-certs", certs, "-name", "shadow2", "-log-level", "info")
	}
	startShadow2()
	r.start("shadow", "run", "-role", "shadow", "-model", filepath.Join(r.dir, "shadow.model"), "-fetch-from", storeAddr, "-quant", "int8", "-layers", "0-1",
		"-stages", shadow2, "-listen", r.shadow, "-workers", workers, "-group", "2", "-certs", certs, "-name", "shadow", "-log-level", "info")

	const n = "16"
	local, swarm := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	statsFile := filepath.Join(r.dir, "stats.json")
	se, code := r.runMain("-prefetch", "shadow", "-shadow", r.shadow, "-stages", strings.Join(stages, ","), "-n", n, "-ignore-eos", "-dump", swarm,
		"-stats", statsFile, "-store", filepath.Join(r.dir, "main.store"), "-store-listen", storeAddr, "-log-level", "info")
	if code != 0 {
		t.Fatalf("main node: exit %d\n%s\n%s", code, se, r.logs())
	}
	sameDump(t, swarm, local)
	if !strings.Contains(se, "no store in -store yet: compressing") {
		t.Errorf("the main node started on an empty -store does not say it made the store:\n%s", se)
	}
	var stats struct {
		Recall *float64 `json:"recall"`
	}
	if b, err := os.ReadFile(statsFile); err != nil || json.Unmarshal(b, &stats) != nil || stats.Recall == nil || *stats.Recall < 0.5 {
		t.Errorf("the run's recall %v (%v): want the staged shadow's predictions scored\n%s", stats.Recall, err, r.logs())
	}
	for name, ready := range map[string]string{"stage1": "stage ready", "stage2": "stage ready", "shadow": "shadow ready", "shadow2": "shadow stage ready"} {
		log := r.logOf(name)
		if !strings.Contains(log, ready) {
			t.Errorf("%s's log does not say %q:\n%s", name, ready, log)
		}
		if !strings.Contains(log, "its part of the checkpoint fetched") || !strings.Contains(log, "kept=\"0 B\"") && !strings.Contains(log, "kept=0B") {
			t.Errorf("%s's log does not say it fetched its part of the checkpoint from nothing:\n%s", name, log)
		}
	}
	// what each fetched is its layers: the first stages the embedding, the
	// shadow's the head too, the main stages no expert
	for name, want := range map[string][]string{
		"stage1":  {"embedding.safetensors", "layer-000.safetensors", "layer-001.safetensors"},
		"stage2":  {"layer-002.safetensors", "layer-003.safetensors"},
		"shadow":  {"embedding.safetensors", "head.safetensors", "layer-000-experts.safetensors", "layer-000.safetensors", "layer-001-experts.safetensors", "layer-001.safetensors"},
		"shadow2": {"layer-002.safetensors", "layer-003.safetensors"},
	} {
		got, _ := filepath.Glob(filepath.Join(r.dir, name+".model", "*.safetensors"))
		for i := range got {
			got[i] = filepath.Base(got[i])
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s fetched %v, want %v", name, got, want)
		}
	}
	// the workers were told shadow2 relays the store, and took chunks of
	// its layers from it
	if log := r.logOf("w1"); !strings.Contains(log, "holders=") || !strings.Contains(log, shadow2) {
		t.Errorf("w1 was not told shadow2 relays the store:\n%s", log)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !regexp.MustCompile(`a worker fetching from its store is done.*served="[1-9]`).MatchString(r.logOf("shadow2")) {
		if time.Now().After(deadline) {
			t.Fatalf("shadow2 served no worker chunks:\n%s", r.logOf("shadow2"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// shadow2's experts came as chunks: its layers' whole (each expert
	// reads back), the others' holes
	if log := r.logOf("shadow2"); !strings.Contains(log, "its experts as the store's chunks") {
		t.Errorf("shadow2's log does not say its experts came as the store's chunks:\n%s", log)
	}
	share, err := store.Open(filepath.Join(r.dir, "shadow2.store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []int{2, 3} {
		size, _ := share.ExpertBytes(l, 0)
		if _, err := share.ReadExpert(context.Background(), l, 0, make([]byte, size)); err != nil {
			t.Errorf("shadow2's store: layer %d expert 0: %v", l, err)
		}
	}
	size, _ := share.ExpertBytes(0, 0)
	if _, err := share.ReadExpert(context.Background(), 0, 0, make([]byte, size)); err == nil {
		t.Error("shadow2's store holds layer 0's experts: more than its share")
	}
	share.Close()
	// stage2 started again while the main node is down starts on what
	// it fetched before
	r.signal("stage2", syscall.SIGKILL)
	startStage(1, "2-")
	deadline = time.Now().Add(60 * time.Second)
	for strings.Count(r.logOf("stage2"), "stage ready") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("stage2 started again with no source never got ready:\n%s", r.logOf("stage2"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log := r.logOf("stage2"); !strings.Contains(log, "checking what the directory holds against the one it kept") || !strings.Contains(log, "offline=true") {
		t.Errorf("stage2 started again with no source does not say it checked what it fetched before:\n%s", log)
	}
	// and so does shadow2, its experts from the store it filled
	r.signal("shadow2", syscall.SIGKILL)
	startShadow2()
	for strings.Count(r.logOf("shadow2"), "shadow stage ready") < 2 {
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("shadow2 started again with no source never got ready:\n%s", r.logOf("shadow2"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log := r.logOf("shadow2"); !strings.Contains(log, "its experts read from the store as it holds them") {
		t.Errorf("shadow2 started again with no source does not say it read its experts from the store it holds:\n%s", log)
	}
}

// TestAWorkerStartedEmptyRejoinsOnceItsShareIsIn: real processes on
// loopback; w4 is SIGKILLed mid-run and started again on an empty
// directory with -fetch-from the main node and a -fetch-rate: the main
// node keeps it out of the layout while it fills its share (paced, from
// the main node and its group's other member) and takes it back once it
// says its share is in; killed again a second into its fill and started
// again, it keeps what it fetched and fetches the rest alone (its log's
// bytes); the run is local mode's bit for bit.
func TestAWorkerStartedEmptyRejoinsOnceItsShareIsIn(t *testing.T) {
	if testing.Short() {
		t.Skip("a run of several seconds with real processes")
	}
	r := newChaosRig(t, 4)
	for i := range r.workers {
		r.startWorker(i)
	}
	storeAddr := freeLoopbackAddr(t)
	const tokens = 64
	n := strconv.Itoa(tokens)
	local, swarm := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	mainCmd := r.start("main", "run", "-role", "main", "-model", r.model, "-workers", strings.Join(r.workers, ","), "-group", "2", "-prefetch", "reactive",
		"-store", r.store, "-store-listen", storeAddr, "-certs", filepath.Join(r.dir, "certs"), "-name", "main",
		"-n", n, "-ignore-eos", "-dump", swarm, "-log-level", "info")
	exited := make(chan error, 1)
	go func() { exited <- mainCmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(r.logOf("main"), "all workers connected") {
		if time.Now().After(deadline) {
			t.Fatalf("the main node never connected\n%s", r.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	r.signal("w4", syscall.SIGKILL)
	startEmpty := func() {
		r.start("w4", "run", "-role", "worker", "-listen", r.workers[3], "-store", filepath.Join(r.dir, "w4.empty"), "-fetch-from", storeAddr, "-fetch-rate", "1MB",
			"-certs", filepath.Join(r.dir, "certs"), "-name", "w4", "-device-mem", "64MiB", "-load-bw", "8MB", "-log-level", "info")
	}
	startEmpty()
	// killed again a second into its fill, and started again on what it
	// fetched: it fetches the rest only
	for !strings.Contains(r.logOf("w4"), "filling its share of the store in the background") {
		if time.Now().After(deadline.Add(time.Minute)) {
			t.Fatalf("w4 never started filling its share\n%s", r.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	r.signal("w4", syscall.SIGKILL)
	startEmpty()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("main node: %v\n%s", err, r.logs())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the run did not end\n%s", r.logs())
	}
	sameDump(t, swarm, local)
	mainLog, w4 := r.logOf("main"), r.logOf("w4")
	kept := strings.Index(mainLog, "it rejoins the layout once its share of the store is in")
	back := strings.LastIndex(mainLog, "mainnode: worker rejoined the layout")
	if kept < 0 || back < kept || !strings.Contains(w4, "its share of the store filled") {
		t.Fatalf("want the main node to keep w4 out until its share was in, then take it back; main:\n%s\nw4:\n%s", mainLog, w4)
	}
	fill := w4[strings.LastIndex(w4, "its share of the store filled"):]
	fill, _, _ = strings.Cut(fill, "\n")
	b := map[string]int64{}
	for _, m := range regexp.MustCompile(`(share|kept|fetched)_bytes=(\d+)`).FindAllStringSubmatch(fill, -1) {
		b[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
	}
	if b["share"] == 0 || b["kept"] == 0 || b["kept"]+b["fetched"] < b["share"] || b["fetched"] >= b["share"] {
		t.Fatalf("w4 started again halfway through its fill: %v; want what it had kept and the rest alone fetched (%s)", b, fill)
	}
}

// liar serves a store's chunks with a bit flipped, saying they pass.
type liar struct{ *store.Store }

func (l liar) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	if err := l.Store.ReadChunk(ctx, ref, dst); err != nil {
		return err
	}
	if len(dst) > 0 {
		dst[len(dst)/2] ^= 0x20
	}
	return nil
}

func (liar) CheckChunk(store.ChunkRef, []byte) error { return nil }

// TestAWorkerCatchesAPeerServingAFlippedChunk: a node with a cluster
// certificate (w9, in this test's process over real QUIC) serves every
// chunk with a bit flipped; a worker started empty with -fetch-from it
// first and the main node after catches each against the store's index,
// names w9 in its log and takes the chunk from the main node; the run is
// local mode's bit for bit.
func TestAWorkerCatchesAPeerServingAFlippedChunk(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes")
	}
	r := newChaosRig(t, 2)
	certs := filepath.Join(r.dir, "certs")
	if _, se, code := run(t, "", "certs", "-out", certs, "-nodes", "w9", "-log-level", "warn"); code != 0 {
		t.Fatalf("certs: %s", se)
	}
	held, err := store.Open(r.store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	wc, err := wire.LoadCerts(certs, "w9")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := wire.ListenStream(ctx, freeLoopbackAddr(t), &wire.Config{Certs: wc, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() { fetch.Serve(ctx, p, fetch.Served{Store: liar{held}}, nil); p.Close() }()
		}
	}()
	storeAddr := freeLoopbackAddr(t)
	r.start("w1", "run", "-role", "worker", "-listen", r.workers[0], "-store", filepath.Join(r.dir, "w1.empty"), "-fetch-from", ln.Addr().String()+","+storeAddr,
		"-certs", certs, "-name", "w1", "-device-mem", "64MiB", "-log-level", "info")
	r.startWorker(1)
	const n = "8"
	local, swarm := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	se, code := r.runMain("-prefetch", "reactive", "-n", n, "-ignore-eos", "-dump", swarm, "-store", r.store, "-store-listen", storeAddr)
	if code != 0 {
		t.Fatalf("main node: exit %d\n%s\n%s", code, se, r.logs())
	}
	sameDump(t, swarm, local)
	w1 := r.logOf("w1")
	if !strings.Contains(w1, "a source served a bad chunk") || !strings.Contains(w1, "source=w9") {
		t.Fatalf("w1's log does not name w9 for a bad chunk:\n%s", w1)
	}
}
