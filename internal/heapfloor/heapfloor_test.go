package heapfloor

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
)

// childEnv makes the test binary a fresh process that sets the floor it
// names, first thing (as a node does), and measures it.
const childEnv = "HEAPFLOOR_TEST_FLOOR"

// measured is what a child reports.
type measured struct {
	Collections                   int    // collections while 16 MiB were allocated after Floor
	Goal                          uint64 // the collector's goal after Floor, bytes
	ResidentBefore, ResidentAfter int64  // the process's resident memory around Floor
}

const testFloor = 64 << 20

func TestMain(m *testing.M) {
	if n := os.Getenv(childEnv); n != "" {
		if err := child(n); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func child(floor string) error {
	n, err := strconv.Atoi(floor)
	if err != nil {
		return err
	}
	var m measured
	if m.ResidentBefore, err = resident(); err != nil {
		return err
	}
	Floor(n)
	Floor(0) // only the first call counts
	runtime.GC()
	if m.ResidentAfter, err = resident(); err != nil {
		return err
	}
	m.Goal, m.Collections = heapGoal(), allocate()
	return json.NewEncoder(os.Stdout).Encode(m)
}

// allocate makes 16 MiB of garbage in 1 KiB pieces and returns how many
// collections ran meanwhile.
func allocate() int {
	var st runtime.MemStats
	runtime.ReadMemStats(&st)
	before := st.NumGC
	var keep []byte
	for range 16 << 10 {
		keep = make([]byte, 1<<10)
	}
	_ = keep
	runtime.ReadMemStats(&st)
	return int(st.NumGC - before)
}

// heapGoal is the collector's current goal, in bytes.
func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// resident is this process's resident memory (Linux's /proc/self/statm:
// every test machine of ours runs Linux).
func resident() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	return pages * int64(os.Getpagesize()), err
}

// measure runs a fresh test binary that sets a floor of n bytes.
func measure(t *testing.T, n int) measured {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// the collector's own settings as a node runs with them, whatever the
	// test's: the goal without a floor grows with GOMAXPROCS, and so do
	// the mark workers' stacks a collection adds to resident memory
	cmd.Env = []string{fmt.Sprintf("%s=%d", childEnv, n), "GOMAXPROCS=2", "GOGC=100"}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child with a %d-byte floor: %v: %s", n, err, out)
	}
	var m measured
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("child's report %q: %v", out, err)
	}
	t.Logf("floor %d: %+v", n, m)
	return m
}

func TestFloorSpacesTheCollectionsWithoutResidentMemory(t *testing.T) {
	without, with := measure(t, 0), measure(t, testFloor)
	if without.Goal >= testFloor || with.Goal < 2*testFloor {
		t.Errorf("the collector's goal: %d bytes without a %d-byte floor (want under it), %d with it (want at least twice it)", without.Goal, testFloor, with.Goal)
	}
	if without.Collections < 2 || with.Collections != 0 {
		t.Errorf("16 MiB allocated: %d collections without the floor (want >= 2), %d with it (want 0)", without.Collections, with.Collections)
	}
	// beside what a collection alone adds (the child without a floor)
	if grew := (with.ResidentAfter - with.ResidentBefore) - (without.ResidentAfter - without.ResidentBefore); grew > 8<<20 {
		t.Errorf("the %d-byte floor grew resident memory by %d bytes more than a collection alone, want under 8 MiB", testFloor, grew)
	}
}
