package testbed

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/internal/cpuset"
	"github.com/odmoe/odmoe/runflags"
)

func TestParseCPULine(t *testing.T) {
	// Fields after "cpu": user nice system idle iowait irq softirq steal
	// guest guest_nice (proc(5)). Busy leaves out idle and iowait; guest
	// time is already counted in user and nice.
	for _, tc := range []struct {
		line string
		want CPUTimes
	}{
		{"cpu  100 5 50 1000 20 3 2 0 0 0", CPUTimes{Busy: 100 + 5 + 50 + 3 + 2 + 0, Total: 100 + 5 + 50 + 1000 + 20 + 3 + 2 + 0}},
		{"cpu  100 5 50 1000 20 3 2 7 40 9", CPUTimes{Busy: 100 + 5 + 50 + 3 + 2 + 7, Total: 100 + 5 + 50 + 1000 + 20 + 3 + 2 + 7}},
		{"cpu 1 2 3 4", CPUTimes{Busy: 1 + 2 + 3, Total: 1 + 2 + 3 + 4}}, // before iowait existed
		{"cpu0 100 5 50 1000 20 3 2 0 0 0", CPUTimes{}},                  // one CPU, not the machine
		{"intr 1 2 3 4 5 6", CPUTimes{}},
		{"cpu 1 2 3", CPUTimes{}},
		{"", CPUTimes{}},
	} {
		if got := parseCPULine(tc.line); got != tc.want {
			t.Errorf("parseCPULine(%q) = %+v, want %+v", tc.line, got, tc.want)
		}
	}
}

func TestBusySince(t *testing.T) {
	before := CPUTimes{Busy: 160, Total: 1180}
	for _, tc := range []struct {
		name  string
		after CPUTimes
		want  float64
	}{
		{"30 of 100 busy", CPUTimes{Busy: 190, Total: 1280}, 0.3},
		{"all busy", CPUTimes{Busy: 260, Total: 1280}, 1},
		{"all idle", CPUTimes{Busy: 160, Total: 1280}, 0},
		{"no time passed", before, 0},
		{"total went back", CPUTimes{Busy: 170, Total: 1000}, 0},
	} {
		if got := tc.after.BusySince(before); !(math.Abs(got-tc.want) <= 1e-12) { // NaN fails too
			t.Errorf("%s: BusySince = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A benchmark pinned to some of the machine's CPUs (taskset) still
// reports the machine's count, and says where it ran: this test's binary
// run again on CPU 0 alone.
func TestReadMachineUnderTasksetReportsTheMachine(t *testing.T) {
	if os.Getenv("ODMOE_TEST_READ_MACHINE") == "1" {
		json.NewEncoder(os.Stdout).Encode(ReadMachine())
		os.Exit(0)
	}
	if runtime.GOOS != "linux" || runtime.NumCPU() < 2 {
		t.Skip("needs Linux and two CPUs or more")
	}
	cmd := cpuset.CommandContext(t.Context(), "0", os.Args[0], "-test.run", "^TestReadMachineUnderTasksetReportsTheMachine$")
	cmd.Env = append(os.Environ(), "ODMOE_TEST_READ_MACHINE=1")
	b, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var m Machine
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if m.CPUs != runtime.NumCPU() || m.BenchCPUs != "0" {
		t.Errorf("pinned to CPU 0: %+v, want %d CPUs and the benchmark on 0", m, runtime.NumCPU())
	}
	if !strings.Contains(m.String(), "the benchmark on CPUs 0") {
		t.Errorf("String() = %q", m.String())
	}
}

func TestReadMachineAndCPU(t *testing.T) {
	m := ReadMachine()
	if m.CPUs <= 0 || m.CPUs != runtime.NumCPU() || m.BenchCPUs != "" {
		t.Errorf("CPUs = %d (the benchmark on %q), want runtime.NumCPU() = %d, unpinned", m.CPUs, m.BenchCPUs, runtime.NumCPU())
	}
	if runtime.GOOS != "linux" {
		return // the rest comes from /proc
	}
	if m.Kernel == "" || strings.TrimSpace(m.Kernel) != m.Kernel {
		t.Errorf("Kernel = %q, want the trimmed kernel release", m.Kernel)
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		// MemTotal in kB; MemGiB is it rounded to whole GiB.
		f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			if gib := kb / (1 << 20); math.Abs(float64(m.MemGiB)-gib) > 0.5 {
				t.Errorf("MemGiB = %d, but MemTotal is %.2f GiB", m.MemGiB, gib)
			}
		}
	}
	c1 := ReadCPU()
	if c1.Total == 0 || c1.Busy > c1.Total {
		t.Errorf("ReadCPU = %+v, want busy <= total, total > 0", c1)
	}
	c2 := ReadCPU()
	if c2.Total < c1.Total || c2.Busy < c1.Busy {
		t.Errorf("ReadCPU went back: %+v then %+v", c1, c2)
	}
	if f := c2.BusySince(c1); f < 0 || f > 1 {
		t.Errorf("BusySince = %v, want a fraction", f)
	}
}

// stats is a node's -stats JSON with the fields the report shows.
func stats(t *testing.T, ttftMs, decode float64, recall *float64, peak map[string]int64) json.RawMessage {
	t.Helper()
	m := map[string]any{
		"ttft_ms": ttftMs, "decode_tokens_per_s": decode, "output_tokens_per_s": decode / 2,
		"expert_loads": 42, "misses": 7, "stall_fraction": 0.125, "peak_memory_bytes": peak,
		"unrelated": "ignored",
	}
	if recall != nil {
		m["recall"] = *recall
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reportRuns are the runs of three cases as Bench makes them: every case
// of a mode, then the next mode. p16-o8: shadow at 9 of resident's 10
// tok/s, the reactive run's CPU 80% busy, the shadow run's logits
// differ. p32-o4: 15 of 20 tok/s. p8-o2: no shadow run.
func reportRuns(t *testing.T) []Run {
	const mb = 1 << 20
	recall := 0.9375
	peakLocal := map[string]int64{"local": 100 * mb}
	peakSwarm := map[string]int64{"main": 50 * mb, "shadow": 30 * mb, "worker_device": 200 * mb, "worker_rss": 80 * mb}
	c1 := func(m Mode, decode float64, r *float64, peak map[string]int64) Run {
		return Run{Mode: m, Case: "p16-o8", Prompt: 16, Output: 8, Stats: stats(t, 250, decode, r, peak), Identical: true, CPUBusy: 0.5}
	}
	c2 := func(m Mode, decode float64, r *float64, peak map[string]int64) Run {
		return Run{Mode: m, Case: "p32-o4", Prompt: 32, Output: 4, Stats: stats(t, 500, decode, r, peak), Identical: true, CPUBusy: 0.7}
	}
	c3 := func(m Mode, decode float64) Run {
		return Run{Mode: m, Case: "p8-o2", Prompt: 8, Output: 2, Stats: stats(t, 100, decode, nil, peakSwarm), Identical: true, CPUBusy: 0.2}
	}
	reactive := c1(ModeReactive, 4, nil, peakSwarm)
	reactive.CPUBusy = 0.8
	shadow := c1(ModeShadow, 9, &recall, peakSwarm)
	shadow.Identical, shadow.Diff = false, "logits.npy differs from local mode's"
	return []Run{
		c1(ModeLocal, 12, nil, peakLocal), c2(ModeLocal, 24, nil, peakLocal), c3(ModeLocal, 30),
		c1(ModeResident, 10, nil, peakSwarm), c2(ModeResident, 20, nil, peakSwarm), c3(ModeResident, 25),
		reactive, c2(ModeReactive, 8, nil, peakSwarm),
		shadow, c2(ModeShadow, 15, &recall, peakSwarm),
	}
}

func testReport(runs []Run) *Report {
	return &Report{Date: "2026-01-02T03:04:05Z", Command: "odmoe testbed bench -rig rigs/ci.rig",
		Machine: Machine{CPUs: 16, CPU: "Test CPU", Kernel: "6.1.0", MemGiB: 64},
		Rig:     "rigs/ci.rig", Via: "netns", Nodes: []string{"main main 10.77.0.11", "w1 worker 10.77.0.13:7400"},
		Link:  map[string]string{"rate": "1gbit", "delay": "0.1ms", "delay_by": "app", "loss": "0"},
		Model: "testdata/tiny", Runs: runs}
}

// mdSection is one case's part of the report: its heading and table rows.
type mdSection struct {
	heading string
	rows    [][]string // cells of each data row, trimmed
	text    string     // everything up to the next heading
}

func splitMarkdown(md string) []mdSection {
	var secs []mdSection
	for _, part := range strings.Split(md, "\n## ")[1:] {
		heading, body, _ := strings.Cut(part, "\n")
		s := mdSection{heading: heading, text: body}
		for line := range strings.SplitSeq(body, "\n") {
			if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| mode |") {
				continue
			}
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			s.rows = append(s.rows, cells)
		}
		secs = append(secs, s)
	}
	return secs
}

// The table's columns.
const (
	colMode = iota
	colTTFT
	colDecode
	colOutput
	colRecall
	colLoads
	colMisses
	colStall
	colLead
	colPeak
	colBusy
	colSame
	nCols
)

func TestWriteMarkdownTablesPerCase(t *testing.T) {
	var buf bytes.Buffer
	WriteMarkdown(&buf, testReport(reportRuns(t)), []string{"timeline-resident.svg", "timeline.svg"})
	md := buf.String()

	for _, w := range []string{"- date: 2026-01-02T03:04:05Z", "16 CPUs (Test CPU), 64 GiB, kernel 6.1.0",
		"rigs/ci.rig via netns, 2 nodes: main main 10.77.0.11; w1 worker 10.77.0.13:7400",
		"rate 1gbit, delay 0.1ms (applied by app), loss 0%", "`odmoe testbed bench -rig rigs/ci.rig`"} {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q", w)
		}
	}
	if n := strings.Count(md, "| mode | TTFT ms |"); n != 3 {
		t.Errorf("%d table headers, want 3 (one per case)", n)
	}
	secs := splitMarkdown(md)
	if len(secs) != 4 || secs[3].heading != "Timelines" {
		t.Fatalf("sections %q, want three cases and Timelines", headings(secs))
	}
	type want struct {
		heading string
		modes   []Mode
		ratio   string // the shadow/resident line's figure; "" for none
	}
	for i, w := range []want{
		{"16 prompt tokens, 8 output tokens", AllModes, "**90.0%**"},
		{"32 prompt tokens, 4 output tokens", AllModes, "**75.0%**"},
		{"8 prompt tokens, 2 output tokens", []Mode{ModeLocal, ModeResident}, ""},
	} {
		s := secs[i]
		if s.heading != w.heading {
			t.Errorf("section %d is %q, want %q", i, s.heading, w.heading)
		}
		var modes []Mode
		for _, r := range s.rows {
			if len(r) != nCols {
				t.Fatalf("%s: row %q has %d cells, want %d", s.heading, r, len(r), nCols)
			}
			modes = append(modes, Mode(r[colMode]))
		}
		if !slices.Equal(modes, w.modes) {
			t.Errorf("%s: rows %q, want %q", s.heading, modes, w.modes)
		}
		hasRatio := strings.Contains(s.text, "Shadow-driven decode reaches")
		if w.ratio == "" && hasRatio {
			t.Errorf("%s: a shadow/resident line without a shadow run:\n%s", s.heading, s.text)
		}
		if w.ratio != "" && !strings.Contains(s.text, "reaches "+w.ratio+" of the resident") {
			t.Errorf("%s: no shadow/resident line with %s:\n%s", s.heading, w.ratio, s.text)
		}
	}

	row := func(sec int, m Mode) []string {
		for _, r := range secs[sec].rows {
			if r[colMode] == string(m) {
				return r
			}
		}
		t.Fatalf("%s: no %s row", secs[sec].heading, m)
		return nil
	}
	// Figures of p16-o8's shadow run.
	sh := row(0, ModeShadow)
	for col, want := range map[int]string{colTTFT: "250.0", colDecode: "9.00", colOutput: "4.50", colRecall: "93.75%",
		colLoads: "42", colMisses: "7", colStall: "12.5%", colPeak: "50 / 30 / 200 / 80", colBusy: "50%"} {
		if sh[col] != want {
			t.Errorf("p16-o8 shadow column %d = %q, want %q", col, sh[col], want)
		}
	}
	if want := "**NO**: logits.npy differs from local mode's"; sh[colSame] != want {
		t.Errorf("p16-o8 shadow bit-identical = %q, want %q", sh[colSame], want)
	}
	if got := row(1, ModeShadow)[colRecall]; got != "93.75%" {
		t.Errorf("p32-o4 shadow recall = %q, want 93.75%%", got)
	}
	// Local mode's peak is its own process's, the rest are absent.
	if got := row(0, ModeLocal)[colPeak]; got != "100 / – / – / –" {
		t.Errorf("local peak memory = %q, want 100 / – / – / –", got)
	}
	for sec := range 3 {
		for _, r := range secs[sec].rows {
			mode := Mode(r[colMode])
			if mode != ModeShadow && r[colRecall] != "–" {
				t.Errorf("%s %s: recall %q, want – (no recall in its stats)", secs[sec].heading, mode, r[colRecall])
			}
			noDiff := sec == 0 && mode == ModeShadow
			if !noDiff && r[colSame] != "yes" {
				t.Errorf("%s %s: bit-identical %q, want yes", secs[sec].heading, mode, r[colSame])
			}
			// Only the 80% run is flagged; 70% (p32-o4) is not above the line.
			flagged := sec == 0 && mode == ModeReactive
			if got := strings.HasSuffix(r[colBusy], "⚠"); got != flagged {
				t.Errorf("%s %s: CPU busy %q, flagged %v, want %v", secs[sec].heading, mode, r[colBusy], got, flagged)
			}
		}
	}
	if got := row(0, ModeReactive)[colBusy]; got != "80% ⚠" {
		t.Errorf("reactive CPU busy = %q, want 80%% ⚠", got)
	}
	if n := strings.Count(md, "⚠ CPU busy above 70%"); n != 1 {
		t.Errorf("%d CPU warnings, want 1", n)
	}
	for _, tl := range []string{"timeline-resident.svg", "timeline.svg"} {
		if !strings.Contains(secs[3].text, "!["+tl+"]("+tl+")") {
			t.Errorf("timelines section lacks an image link to %s:\n%s", tl, secs[3].text)
		}
	}
}

func TestWriteMarkdownWithoutWarningsOrTimelines(t *testing.T) {
	var runs []Run
	for _, r := range reportRuns(t) {
		r.CPUBusy = min(r.CPUBusy, BusyWarning)
		r.Identical, r.Diff = true, ""
		runs = append(runs, r)
	}
	rep := testReport(runs)
	rep.Link = nil
	var buf bytes.Buffer
	WriteMarkdown(&buf, rep, nil)
	md := buf.String()
	for _, no := range []string{"⚠", "**NO**", "## Timelines", "![", "- links:"} {
		if strings.Contains(md, no) {
			t.Errorf("report has %q:\n%s", no, md)
		}
	}
	if n := strings.Count(md, "| yes |"); n != len(runs) {
		t.Errorf("%d bit-identical rows, want %d", n, len(runs))
	}
}

func headings(secs []mdSection) []string {
	var h []string
	for _, s := range secs {
		h = append(h, s.heading)
	}
	return h
}

func TestParseCases(t *testing.T) {
	got, err := ParseCases("16x64,128x256")
	if err != nil {
		t.Fatal(err)
	}
	if want := []Case{{16, 64}, {128, 256}}; !slices.Equal(got, want) {
		t.Errorf("ParseCases = %v, want %v", got, want)
	}
	if got, err := ParseCases(" 8x4 , 1x1 "); err != nil || !slices.Equal(got, []Case{{8, 4}, {1, 1}}) {
		t.Errorf("ParseCases with spaces = %v, %v; want [p8-o4 p1-o1]", got, err)
	}
	if s := (Case{16, 64}).String(); s != "p16-o64" {
		t.Errorf("Case.String = %q, want p16-o64", s)
	}
	for _, bad := range []string{"16x0", "0x64", "-1x5", "abc", "16", "x64", "", "16x64,", "16x64,,8x8"} {
		if c, err := ParseCases(bad); err == nil {
			t.Errorf("ParseCases(%q) = %v, want an error", bad, c)
		} else if !strings.Contains(err.Error(), "PROMPTxOUTPUT") {
			t.Errorf("ParseCases(%q) error %q does not say the form", bad, err)
		}
	}
	// the same case twice would share a run directory, with two prompts
	if c, err := ParseCases("16x64,128x64,16x64"); err == nil || !strings.Contains(err.Error(), "p16-o64 given twice") || !strings.Contains(err.Error(), "-repeat") {
		t.Errorf("ParseCases with a case twice = %v, %v; want an error naming it and -repeat", c, err)
	}
}

// TestKeptRunsTakesTheMedianRepeat: of a case's repeats the report keeps
// the run of median decode tokens/s (the lower middle one of an even
// count) with every rate, a single run as it is, and a repeat that was
// not bit-identical over any faster one.
func TestKeptRunsTakesTheMedianRepeat(t *testing.T) {
	run := func(c string, tps float64, same bool) Run {
		return Run{Mode: ModeResident, Case: c, Identical: same, Stats: json.RawMessage(fmt.Sprintf(`{"decode_tokens_per_s": %v}`, tps))}
	}
	got := keptRuns([][]Run{
		{run("a", 30, true), run("a", 10, true), run("a", 20, true)},
		{run("b", 5, true)},
		{run("c", 4, true), run("c", 1, true), run("c", 3, true), run("c", 2, true)},
		{run("d", 9, true), run("d", 7, false), run("d", 8, true)},
		nil,
	})
	if len(got) != 4 {
		t.Fatalf("kept %d runs, want 4 (one a case)", len(got))
	}
	for i, want := range []struct {
		tps  float64
		runs []float64
		same bool
	}{{20, []float64{30, 10, 20}, true}, {5, nil, true}, {2, []float64{4, 1, 3, 2}, true}, {7, []float64{9, 7, 8}, false}} {
		r := got[i]
		if tps := r.figures().DecodeTokensPerS; tps != want.tps || !slices.Equal(r.DecodeRuns, want.runs) || r.Identical != want.same {
			t.Errorf("case %s: kept %v tok/s (runs %v, identical %v), want %v (runs %v, identical %v)", r.Case, tps, r.DecodeRuns, r.Identical, want.tps, want.runs, want.same)
		}
		if want.runs != nil && len(r.Repeats) != len(want.runs) {
			t.Errorf("case %s: %d repeats kept, want all %d", r.Case, len(r.Repeats), len(want.runs))
		}
	}
	var md strings.Builder
	WriteMarkdown(&md, &Report{Runs: got[:1]}, nil)
	if !strings.Contains(md.String(), "| 20.00 (10.00-30.00, 3 runs) |") {
		t.Errorf("report.md does not give the repeats' range:\n%s", md.String())
	}
}

func TestParseModesRunsLocalFirst(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Mode
	}{
		{"", []Mode{ModeLocal}},
		{"local", []Mode{ModeLocal}},
		{"shadow", []Mode{ModeLocal, ModeShadow}},
		{"resident,reactive,shadow", AllModes},
		{"shadow,local,resident", []Mode{ModeLocal, ModeShadow, ModeResident}}, // local moves first, the rest keep their order
		{" resident , shadow ", []Mode{ModeLocal, ModeResident, ModeShadow}},
		{"residency,residency-uniform", []Mode{ModeLocal, ModeResidency, ModeResidencyUniform}},
		{"resident-shadow,shadow", []Mode{ModeLocal, ModeResidentShadow, ModeShadow}},
	} {
		got, err := ParseModes(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseModes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"bogus", "shadow,oracle-next", "Shadow"} {
		if m, err := ParseModes(bad); err == nil {
			t.Errorf("ParseModes(%q) = %v, want an error", bad, m)
		} else if !strings.Contains(err.Error(), "unknown") {
			t.Errorf("ParseModes(%q) error %q does not say the mode is unknown", bad, err)
		}
	}
}

func TestSameOutput(t *testing.T) {
	write := func(dir, tokens, logits string) string {
		t.Helper()
		for name, c := range map[string]string{"tokens.json": tokens, "logits.npy": logits} {
			if c == "" {
				continue // leave it out
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	const tokens, logits = "[1,2,3]", "\x93NUMPY\x01\x00fake-float32-bytes"
	local := write(t.TempDir(), tokens, logits)
	for _, tc := range []struct {
		name         string
		want, got    string
		wantMentions []string // "" result when empty
	}{
		{"identical", local, write(t.TempDir(), tokens, logits), nil},
		{"logits differ", local, write(t.TempDir(), tokens, logits[:len(logits)-1]+"X"), []string{"logits.npy", "differs"}},
		{"tokens differ", local, write(t.TempDir(), "[1,2,4]", logits), []string{"tokens.json", "differs"}},
		{"no logits", local, write(t.TempDir(), tokens, ""), []string{"logits.npy"}},
		{"no dump at all", local, t.TempDir(), []string{"tokens.json"}},
		{"no reference", t.TempDir(), local, []string{"reference", "tokens.json"}},
	} {
		msg := sameOutput(tc.want, tc.got)
		if tc.wantMentions == nil {
			if msg != "" {
				t.Errorf("%s: sameOutput = %q, want \"\"", tc.name, msg)
			}
			continue
		}
		if msg == "" {
			t.Errorf("%s: sameOutput = \"\", want a difference", tc.name)
		}
		for _, w := range tc.wantMentions {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: sameOutput = %q, does not mention %q", tc.name, msg, w)
			}
		}
	}
}

// TestResidencyModesStartTheSwarmWithResidency: residency modes run the
// shadow-driven main node with -residency on (uniform placement in
// residency-uniform), their workers get -residency-device-mem after the
// rig's own flags (the last one counts), and no other mode is touched;
// the heterogeneous rig reads.
func TestResidencyModesStartTheSwarmWithResidency(t *testing.T) {
	rig, err := ReadRig("rigs/hetero.rig")
	if err != nil {
		t.Fatal(err)
	}
	if len(rig.Workers) != 8 || rig.Shadow == nil {
		t.Fatalf("hetero.rig: %d workers, shadow %v", len(rig.Workers), rig.Shadow)
	}
	opt := BenchOptions{Rig: rig, Via: Local{Files: Paths{Model: "m", Store: "s", Certs: "c"}}, ResidencyDeviceMem: "36MiB"}
	flags := func(args []string) string { return strings.Join(args, " ") }
	for _, tc := range []struct {
		mode             Mode
		residency, fixed bool
	}{
		{ModeShadow, false, false}, {ModeResidency, true, false}, {ModeResidencyUniform, true, true}, {ModeReactive, false, false},
	} {
		main := MainFlags(opt, tc.mode)
		if got := main.Residency == "on"; got != tc.residency {
			t.Errorf("%s main node: %q", tc.mode, flags(main.Args()))
		}
		if got := main.Placement == "uniform"; got != tc.fixed {
			t.Errorf("%s main node: %q", tc.mode, flags(main.Args()))
		}
		if tc.mode.residency() && main.Prefetch != "shadow" {
			t.Errorf("%s main node is not shadow-driven: %q", tc.mode, flags(main.Args()))
		}
		w := runflags.For(runflags.RoleWorker)
		if err := w.Parse(workerArgs(opt, tc.mode, 4)[1:]); err != nil {
			t.Fatal(err)
		}
		want := "28MiB" // w5's own
		if tc.mode.residency() {
			want = "36MiB"
		}
		if w.DeviceMem != want {
			t.Errorf("%s worker w5: -device-mem %s, want %s (%q)", tc.mode, w.DeviceMem, want, flags(workerArgs(opt, tc.mode, 4)))
		}
	}
}

// TestResidentShadowModeRunsTheShadowBesidePinnedWorkers: resident-shadow
// pins every worker's experts as resident mode does, runs a shadow, and
// starts the main node resident (no loads) yet aligned with the shadow
// every pass, as shadow mode aligns; resident mode stays shadowless.
func TestResidentShadowModeRunsTheShadowBesidePinnedWorkers(t *testing.T) {
	rig, err := ReadRig("rigs/loopback.rig")
	if err != nil {
		t.Fatal(err)
	}
	opt := BenchOptions{Rig: rig, Via: Local{Files: Paths{Model: "m", Store: "s", Certs: "c"}}}
	for _, tc := range []struct {
		mode   Mode
		shadow bool
	}{{ModeResident, false}, {ModeResidentShadow, true}} {
		main := MainFlags(opt, tc.mode)
		if main.Prefetch != "resident" {
			t.Errorf("%s main node: -prefetch %s, want resident", tc.mode, main.Prefetch)
		}
		if got := main.Shadow != ""; got != tc.shadow || tc.shadow && (main.Shadow != rig.Shadow.Addr || main.AlignToken != 1 || main.AlignKV != 1) {
			t.Errorf("%s main node: -shadow %q, -align-token %d, -align-kv %d; want a shadow %v aligned every pass", tc.mode, main.Shadow, main.AlignToken, main.AlignKV, tc.shadow)
		}
		if tc.mode.usesShadow() != tc.shadow {
			t.Errorf("%s: usesShadow %v", tc.mode, tc.mode.usesShadow())
		}
		for i := range rig.Workers {
			w := runflags.For(runflags.RoleWorker)
			if err := w.Parse(workerArgs(opt, tc.mode, i)[1:]); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("%d/%d", i, len(rig.Workers)); w.Resident != want {
				t.Errorf("%s worker %d: -resident %q, want %s", tc.mode, i, w.Resident, want)
			}
		}
	}
}

// TestReportGivesBothShadowBaselines: with resident and resident-shadow
// both run, the shadow line gives its share of each; with one of them,
// only that one.
func TestReportGivesBothShadowBaselines(t *testing.T) {
	run := func(m Mode, decode int) Run {
		return Run{Mode: m, Case: "p16-o8", Prompt: 16, Output: 8, Identical: true, Stats: json.RawMessage(fmt.Sprintf(`{"decode_tokens_per_s": %d}`, decode))}
	}
	for _, tc := range []struct {
		runs       []Run
		want, lack []string
	}{
		{[]Run{run(ModeResident, 10), run(ModeResidentShadow, 8), run(ModeShadow, 6)},
			[]string{"Shadow-driven decode reaches **60.0%** of the resident (fully cached) swarm's tokens/s (OD-MoE: ~75% of resident on its rig) and **75.0%** of resident-shadow's"}, nil},
		{[]Run{run(ModeResidentShadow, 8), run(ModeShadow, 6), run(ModeResidency, 4)},
			[]string{"Shadow-driven decode reaches **75.0%** of resident-shadow's", "Shadow-driven decode with -residency on reaches **50.0%** of resident-shadow's"},
			[]string{"fully cached"}},
		{[]Run{run(ModeResident, 10), run(ModeShadow, 6)}, []string{"reaches **60.0%** of the resident (fully cached) swarm's tokens/s (OD-MoE: ~75% of resident on its rig)."}, []string{"resident-shadow's"}},
	} {
		var buf bytes.Buffer
		WriteMarkdown(&buf, testReport(tc.runs), nil)
		text := splitMarkdown(buf.String())[0].text
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("report:\n%s\nwant %q", text, w)
			}
		}
		for _, l := range tc.lack {
			if strings.Contains(text, l) {
				t.Errorf("report:\n%s\nhas %q", text, l)
			}
		}
	}
}

// TestReportShowsThePredictionLead: a run whose stats carry prediction
// leads shows their median in the table; one without shows a dash.
func TestReportShowsThePredictionLead(t *testing.T) {
	withLead := Run{Mode: ModeShadow, Case: "p16-o8", Prompt: 16, Output: 8, Identical: true,
		Stats: json.RawMessage(`{"decode_tokens_per_s": 9, "prediction_lead_ms": {"samples": 40, "p5": 0.5, "p50": 3.25, "p95": 9}}`)}
	without := Run{Mode: ModeReactive, Case: "p16-o8", Prompt: 16, Output: 8, Identical: true, Stats: json.RawMessage(`{"decode_tokens_per_s": 4}`)}
	var buf bytes.Buffer
	WriteMarkdown(&buf, testReport([]Run{without, withLead}), nil)
	rows := splitMarkdown(buf.String())[0].rows
	if len(rows) != 2 || rows[0][colLead] != "–" || rows[1][colLead] != "3.25" {
		t.Fatalf("lead cells %q", rows)
	}
}

// TestReportSplitsTheCPUByRole: a run whose nodes all ran here says what
// each role cost per output token and its share; a run without the
// figures (over ssh) says nothing.
func TestReportSplitsTheCPUByRole(t *testing.T) {
	split := Run{Mode: ModeShadow, Case: "p16-o8", Prompt: 16, Output: 8, Identical: true,
		Stats:      json.RawMessage(`{"decode_tokens_per_s": 9}`),
		CPUSeconds: map[string]float64{"main": 0.4, "shadow": 0.4, "workers": 0.8}}
	none := Run{Mode: ModeResident, Case: "p16-o8", Prompt: 16, Output: 8, Identical: true, Stats: json.RawMessage(`{"decode_tokens_per_s": 10}`)}
	var buf bytes.Buffer
	WriteMarkdown(&buf, testReport([]Run{none, split}), nil)
	text := splitMarkdown(buf.String())[0].text
	want := "CPU ms per output token by role (share of the run's CPU): shadow: main 50.0 (25%), shadow 50.0 (25%), workers 100.0 (50%)."
	if !strings.Contains(text, want) {
		t.Fatalf("report:\n%s\nwant the line %q", text, want)
	}
}

// TestRepeatsKeepTheirOwnFiles: a case's first run keeps the directory
// it always had; each further repeat gets its own, so none overwrites the
// run the report keeps.
func TestRepeatsKeepTheirOwnFiles(t *testing.T) {
	opt := BenchOptions{Out: "/out"}
	c := Case{16, 64}
	seen := map[string]bool{}
	for rep, want := range []string{"/out/runs/shadow-p16-o64", "/out/runs/shadow-p16-o64-r2", "/out/runs/shadow-p16-o64-r3"} {
		if got := runDir(opt, ModeShadow, c, rep); got != want || seen[got] {
			t.Errorf("repeat %d: %s, want %s (and not another repeat's)", rep, got, want)
		}
		seen[want] = true
	}
}

// TestWithPeaksNamesTheMainNode: a run's stats get the main node's peak
// under its name in the rig beside its role's, the rest kept.
func TestWithPeaksNamesTheMainNode(t *testing.T) {
	out, err := withPeaks([]byte(`{"decode_tokens_per_s": 2.5, "peak_memory_bytes": {"main": 5, "shadow": 7}}`), "m1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Decode float64          `json:"decode_tokens_per_s"`
		Peaks  map[string]int64 `json:"peak_memory_bytes"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Decode != 2.5 || st.Peaks["m1"] != 5 || st.Peaks["main"] != 5 || st.Peaks["shadow"] != 7 {
		t.Fatalf("%s: %v", out, err)
	}
	if _, err := withPeaks([]byte(`[1]`), "m1", nil); err == nil {
		t.Fatal("stats that are not an object taken")
	}
}
