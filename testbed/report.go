package testbed

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/odmoe/odmoe/internal/cpuset"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Machine describes where the benchmark ran.
type Machine struct {
	CPUs   int    `json:"cpus"` // the machine's, whatever this process may run on
	CPU    string `json:"cpu"`
	Kernel string `json:"kernel"`
	MemGiB int    `json:"mem_gib"`
	// BenchCPUs are the CPUs the benchmark's own process ran on when it
	// was pinned to fewer than the machine's (taskset), "" otherwise.
	BenchCPUs string `json:"bench_cpus,omitempty"`
}

// String is the machine as a report's header line says it.
func (m Machine) String() string {
	s := fmt.Sprintf("%d CPUs (%s), %d GiB, kernel %s", m.CPUs, m.CPU, m.MemGiB, m.Kernel)
	if m.BenchCPUs != "" {
		s += "; the benchmark on CPUs " + m.BenchCPUs
	}
	return s
}

// LoadAvg is /proc/loadavg's 1, 5 and 15 minute load averages ("unknown"
// where there is none).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// ReadMachine describes this machine from /proc.
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU()} // the CPUs this process may run on, unless /proc says more
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		processors := 0
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			switch k = strings.TrimSpace(k); {
			case !ok:
			case k == "processor":
				processors++
			case k == "model name" && m.CPU == "":
				m.CPU = strings.TrimSpace(v)
			}
		}
		if processors > m.CPUs { // this process is pinned to some of them
			m.CPUs = processors
			m.BenchCPUs, _ = cpuset.OfProcess(0)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		fmt.Sscanf(string(b), "MemTotal: %d kB", &kb)
		m.MemGiB = (kb + 1<<19) >> 20
	}
	return m
}

// CPUTimes are the machine's cumulative CPU times (jiffies) from
// /proc/stat: busy and total.
type CPUTimes struct{ Busy, Total uint64 }

// ReadCPU reads the "cpu" line of /proc/stat; zero if unavailable.
func ReadCPU() CPUTimes {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return CPUTimes{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return CPUTimes{}
	}
	return parseCPULine(sc.Text())
}

func parseCPULine(line string) CPUTimes {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return CPUTimes{}
	}
	var t CPUTimes
	for i, s := range f[1:] {
		v, _ := strconv.ParseUint(s, 10, 64)
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		t.Total += v
		if i != 3 && i != 4 { // idle, iowait
			t.Busy += v
		}
	}
	return t
}

// BusySince is the busy fraction of CPU time between before and t.
func (t CPUTimes) BusySince(before CPUTimes) float64 {
	if t.Total <= before.Total {
		return 0
	}
	return float64(t.Busy-before.Busy) / float64(t.Total-before.Total)
}

// runFigures are the fields of a node's -stats the report shows.
type runFigures struct {
	TTFTms           float64          `json:"ttft_ms"`
	DecodeTokensPerS float64          `json:"decode_tokens_per_s"`
	OutputTokensPerS float64          `json:"output_tokens_per_s"`
	ExpertLoads      int64            `json:"expert_loads"`
	Misses           int64            `json:"misses"`
	StallFraction    float64          `json:"stall_fraction"`
	PeakMemory       map[string]int64 `json:"peak_memory_bytes"`
	Recall           *float64         `json:"recall"`
	Faults           map[string]int64 `json:"faults"`
	Residency        map[string]int64 `json:"residency"`
	Ahead            *struct {
		Passes         int64   `json:"iterations"`
		Agreed         int64   `json:"agreed"`
		Rewound        int64   `json:"rewound"`
		TokenAgreement float64 `json:"token_agreement"`
		WithdrawnLoads int64   `json:"withdrawn_loads"`
		WithdrawnBytes int64   `json:"withdrawn_bytes"`
	} `json:"shadow_ahead"`
	Lead *struct {
		P50 float64 `json:"p50"`
	} `json:"prediction_lead_ms"`
	Drafting *struct {
		Guesses       int     `json:"guesses"`
		Accepted      int     `json:"accepted"`
		TokensPerPass float64 `json:"tokens_per_pass"`
	} `json:"drafting"`
	Passes []struct {
		Layer     int     `json:"layer"` // the pass
		MainMs    float64 `json:"main_ms"`
		ExpertsMs float64 `json:"experts_ms"`
	} `json:"iterations"`
}

// recoveryMs is what a fault cost the decode pass it hit: the
// slowest decode pass's wall time (main-node compute plus waiting
// for experts) less the median's.
func (f runFigures) recoveryMs() float64 {
	var ms []float64
	for _, it := range f.Passes {
		if it.Layer >= 2 { // pass 1 is the prompt
			ms = append(ms, it.MainMs+it.ExpertsMs)
		}
	}
	if len(ms) == 0 {
		return 0
	}
	slices.Sort(ms)
	return ms[len(ms)-1] - ms[len(ms)/2]
}

func (r Run) figures() runFigures {
	var f runFigures
	json.Unmarshal(r.Stats, &f)
	return f
}

// writeFault says what the fault run's killed worker cost, next to the
// shadow run without a fault (decode tokens/s shadowTokS).
func writeFault(w io.Writer, r Run, shadowTokS float64) {
	f := r.figures()
	if f.Faults["workers_lost"] == 0 {
		fmt.Fprintf(w, "\nFault: %s was killed %.1f s after the main node started, but the run had no worker to lose by then (it ended first, or the kill failed): nothing measured.\n", r.FaultNode, r.FaultAtS)
		return
	}
	vs := ""
	if shadowTokS > 0 {
		vs = fmt.Sprintf(" against %.2f without it (**%.1f%%**)", shadowTokS, 100*f.DecodeTokensPerS/shadowTokS)
	}
	fmt.Fprintf(w, "\nFault: %s killed (SIGKILL) %.1f s after the main node started: decode %.2f tok/s%s; recovery **%.0f ms** (the decode pass the fault hit, over the median: detecting the silent worker within -peer-timeout, then re-sending its requests); %d worker(s) lost, %d request(s) re-sent, %d rejoined; bit-identical: %v.\n",
		r.FaultNode, r.FaultAtS, f.DecodeTokensPerS, vs, f.recoveryMs(), f.Faults["workers_lost"], f.Faults["resent_requests"], f.Faults["rejoins"], r.Identical)
}

// writeFill says, for each start of the nodes on their own directories
// (bench rig -fetch), what each node's share was and what it fetched,
// and how long the rig took to have every share against the largest
// share's time at the link rate.
func writeFill(w io.Writer, rep *Report) {
	for i, fs := range rep.Fill {
		var largest int64
		for _, n := range fs.Nodes {
			largest = max(largest, n.ShareBytes)
		}
		fmt.Fprintf(w, "## Start %d from the nodes' own directories (-fetch)\n\n", i+1)
		fmt.Fprintln(w, "| node | role | share MiB | fetched MiB | fetched / share | had its share at s |")
		fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
		for _, n := range fs.Nodes {
			ratio := "–"
			if n.ShareBytes > 0 {
				ratio = fmt.Sprintf("%.3f", float64(n.FetchedBytes)/float64(n.ShareBytes))
			}
			fmt.Fprintf(w, "| %s | %s | %.1f | %.1f | %s | %.1f |\n", n.Name, n.Role, float64(n.ShareBytes)/(1<<20), float64(n.FetchedBytes)/(1<<20), ratio, n.ReadyS)
		}
		if fs.ServingS > 0 {
			fmt.Fprintf(w, "\nThe main node served (every worker and stage up; the shadow attaching when it is) %.1f s after the nodes started.", fs.ServingS)
		}
		fmt.Fprintf(w, "\nEvery node had its share %.1f s after they started", fs.ReadyS)
		if bits := linkBits(rep.Link); bits > 0 && largest > 0 {
			at := float64(largest) * 8 / bits
			fmt.Fprintf(w, "; the largest share (%.1f MiB) takes %.1f s at the link rate (%s): **%.2fx** that", float64(largest)/(1<<20), at, rep.Link["rate"], fs.ReadyS/at)
		}
		fmt.Fprintln(w, ".")
		fmt.Fprintln(w)
	}
}

// BusyWarning is the CPU-busy fraction above which a run on the emulated
// rig measures the shared CPU more than the swarm (FIELD-NOTES.md).
const BusyWarning = 0.70

func mib(b int64) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", float64(b)/(1<<20))
}

// WriteMarkdown writes the report's tables: one per case, one row per
// mode, and the shadow-driven decode speed as a fraction of the resident
// swarm's.
func WriteMarkdown(w io.Writer, rep *Report, timelines []string) {
	fmt.Fprintf(w, "# odmoe rig benchmark\n\n")
	fmt.Fprintf(w, "- date: %s\n- machine: %s\n", rep.Date, rep.Machine)
	fmt.Fprintf(w, "- rig: %s via %s, %d nodes: %s\n", rep.Rig, rep.Via, len(rep.Nodes), strings.Join(rep.Nodes, "; "))
	if len(rep.Link) > 0 {
		fmt.Fprintf(w, "- links: rate %s, delay %s (applied by %s), loss %s%%\n", rep.Link["rate"], rep.Link["delay"], rep.Link["delay_by"], rep.Link["loss"])
	}
	fmt.Fprintf(w, "- model: %s\n- command: `%s`\n\n", rep.Model, rep.Command)
	writeFill(w, rep)
	var cases []string
	byCase := map[string][]Run{}
	for _, r := range rep.Runs {
		if _, ok := byCase[r.Case]; !ok {
			cases = append(cases, r.Case)
		}
		byCase[r.Case] = append(byCase[r.Case], r)
	}
	var flagged bool
	for _, c := range cases {
		runs := byCase[c]
		fmt.Fprintf(w, "## %d prompt tokens, %d output tokens\n\n", runs[0].Prompt, runs[0].Output)
		fmt.Fprintln(w, "| mode | TTFT ms | decode tok/s | output tok/s | recall | loads | misses | stall | lead p50 ms | peak MiB main / shadow / worker dev / worker RSS | CPU busy | bit-identical |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
		var resident, residentShadow, shadow, late, residency, uniform float64
		var faulted *Run
		for _, r := range runs {
			f := r.figures()
			recall := "–"
			if f.Recall != nil {
				recall = fmt.Sprintf("%.2f%%", 100**f.Recall)
			}
			main := f.PeakMemory["main"]
			if r.Mode == ModeLocal {
				main = f.PeakMemory["local"]
			}
			busy := fmt.Sprintf("%.0f%%", 100*r.CPUBusy)
			if r.CPUBusy > BusyWarning {
				busy += " ⚠"
				flagged = true
			}
			same := "yes"
			if !r.Identical {
				same = "**NO**: " + r.Diff
			}
			lead := "–"
			if f.Lead != nil {
				lead = fmt.Sprintf("%.2f", f.Lead.P50)
			}
			decode := fmt.Sprintf("%.2f", f.DecodeTokensPerS)
			if len(r.DecodeRuns) > 1 {
				decode += fmt.Sprintf(" (%.2f-%.2f, %d runs)", slices.Min(r.DecodeRuns), slices.Max(r.DecodeRuns), len(r.DecodeRuns))
			}
			fmt.Fprintf(w, "| %s | %.1f | %s | %.2f | %s | %d | %d | %.1f%% | %s | %s / %s / %s / %s | %s | %s |\n",
				r.Mode, f.TTFTms, decode, f.OutputTokensPerS, recall, f.ExpertLoads, f.Misses, 100*f.StallFraction, lead,
				mib(main), mib(f.PeakMemory["shadow"]), mib(f.PeakMemory["worker_device"]), mib(f.PeakMemory["worker_rss"]), busy, same)
			switch r.Mode {
			case ModeResident:
				resident = f.DecodeTokensPerS
			case ModeResidentShadow:
				residentShadow = f.DecodeTokensPerS
			case ModeShadow:
				shadow = f.DecodeTokensPerS
			case ModeShadowLate:
				late = f.DecodeTokensPerS
			case ModeResidency:
				residency = f.DecodeTokensPerS
			case ModeResidencyUniform:
				uniform = f.DecodeTokensPerS
			case ModeFault:
				faulted = &r
			}
		}
		writeShadowShares(w, "Shadow-driven decode", " (OD-MoE: ~75% of resident on its rig)", shadow, resident, residentShadow)
		writeShadowShares(w, "With late departure (the shadow's -ahead 0) it", "", late, resident, residentShadow)
		writeShadowShares(w, "Shadow-driven decode with -residency on", "", residency, resident, residentShadow)
		for _, r := range runs {
			if d := r.figures().Drafting; d != nil && d.Guesses > 0 {
				fmt.Fprintf(w, "\n%s: the decode passes checked %d of the shadow's guesses and kept %d (%.0f%%): %.2f tokens a pass.\n",
					r.Mode, d.Guesses, d.Accepted, 100*float64(d.Accepted)/float64(d.Guesses), d.TokensPerPass)
			}
		}
		for _, r := range runs {
			if a := r.figures().Ahead; a != nil && a.Passes > 0 {
				fmt.Fprintf(w, "\n%s: the shadow ran %d decode passes ahead of its alignment; token agreement %.2f%% (%d rows met, %d rewound); %d loads withdrawn on the workers (%s MiB).\n",
					r.Mode, a.Passes, 100*a.TokenAgreement, a.Agreed, a.Rewound, a.WithdrawnLoads, mib(a.WithdrawnBytes))
			}
		}
		writeCPUSplit(w, runs)
		for _, r := range runs {
			if f := r.figures(); f.Residency != nil {
				rs := f.Residency
				fmt.Fprintf(w, "\n%s: %d loads, %d requests served by resident experts (no load), %d resident experts evicted for room, %d resident at the end (%s); %d experts migrated in %d rebalances.\n",
					r.Mode, f.ExpertLoads, rs["resident_hits"], rs["resident_evicted"], rs["resident_experts"], mib(rs["resident_bytes"])+" MiB", rs["migrations"], rs["rebalances"])
			}
		}
		if uniform > 0 && residency > 0 {
			fmt.Fprintf(w, "\nResidency placed by capability and activation decodes at **%.2fx** the tokens/s of uniform placement.\n", residency/uniform)
		}
		if faulted != nil {
			writeFault(w, *faulted, shadow)
		}
		fmt.Fprintln(w)
	}
	if flagged {
		fmt.Fprintf(w, "⚠ CPU busy above %.0f%%: the nodes shared too few cores, so that run measures CPU contention as much as the swarm.\n\n", 100*BusyWarning)
	}
	if len(timelines) > 0 {
		fmt.Fprintln(w, "## Timelines")
		fmt.Fprintln(w)
		for _, t := range timelines {
			fmt.Fprintf(w, "![%s](%s)\n\n", t, t)
		}
	}
	fmt.Fprintln(w, "Peak memory: main/local and shadow are process RSS; a worker's is its device-memory arena (experts + compute buffers) and RSS, the largest over workers. CPU busy is this machine's, over the run: on an emulated rig, every node's.")
}

// writeShadowShares says what share of the resident swarm's decode
// tokens/s a shadow-driven mode reached (what == its tokens/s, 0 if not
// run): of the resident swarm without a shadow (what predictions and
// the shadow's CPU cost together) and of the resident swarm with the
// shadow running (resident-shadow: what the predictions alone cost).
func writeShadowShares(w io.Writer, what, note string, tokS, resident, residentShadow float64) {
	var parts []string
	if tokS > 0 && resident > 0 {
		parts = append(parts, fmt.Sprintf("**%.1f%%** of the resident (fully cached) swarm's tokens/s%s", 100*tokS/resident, note))
	}
	if tokS > 0 && residentShadow > 0 {
		parts = append(parts, fmt.Sprintf("**%.1f%%** of resident-shadow's (the resident swarm paying the shadow's CPU too)", 100*tokS/residentShadow))
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "\n%s reaches %s.\n", what, strings.Join(parts, " and "))
	}
}

// writeCPUSplit says, for the runs whose nodes all ran on this machine,
// the CPU time each role used per output token: on an emulated rig the
// roles share its cores, so a role's CPU is the others' lost time.
func writeCPUSplit(w io.Writer, runs []Run) {
	var lines []string
	for _, r := range runs {
		if len(r.CPUSeconds) == 0 || r.Output == 0 {
			continue
		}
		var total float64
		for _, s := range r.CPUSeconds {
			total += s
		}
		var parts []string
		for _, role := range []string{"main", "stages", "shadow", "workers"} {
			if s, ok := r.CPUSeconds[role]; ok {
				parts = append(parts, fmt.Sprintf("%s %.1f (%.0f%%)", role, 1000*s/float64(r.Output), 100*s/max(total, 1e-9)))
			}
		}
		lines = append(lines, fmt.Sprintf("%s: %s", r.Mode, strings.Join(parts, ", ")))
	}
	if len(lines) > 0 {
		fmt.Fprintf(w, "\nCPU ms per output token by role (share of the run's CPU): %s.\n", strings.Join(lines, "; "))
	}
}
