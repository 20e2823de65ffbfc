package testbed

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/serve"
	"github.com/odmoe/odmoe/wire"
)

// FillStart is one start of the rig's nodes on their own directories
// (BenchOptions.Fetch): what each node's share was and what it fetched,
// and when every node had its share.
type FillStart struct {
	// ReadyS is the seconds from the nodes' start until the last had its
	// share (a worker its share of the store filled, a stage or shadow
	// its part of the checkpoint).
	ReadyS float64 `json:"ready_s"`
	// ServingS is the seconds until the main node served (its API up:
	// every worker and stage answered; the shadow, fetching and
	// quantizing its copy, attaches when it is up), 0 if it did not
	// before every share was in.
	ServingS float64    `json:"serving_s"`
	Nodes    []FillNode `json:"nodes"`
}

// FillNode is one node's share and what it fetched (a worker: expert
// chunk bytes, fetched as it ran and then to fill its share; a stage or
// shadow: its files and tensors), and when it had its share.
type FillNode struct {
	Name         string  `json:"name"`
	Role         string  `json:"role"`
	ShareBytes   int64   `json:"share_bytes"`
	FetchedBytes int64   `json:"fetched_bytes"`
	ReadyS       float64 `json:"ready_s"`
}

// fillMark is what node n logs once it has its share, the line holding
// share_bytes and fetched_bytes.
func fillMark(n Node) string {
	if n.RunRole() == runflags.RoleWorker {
		return "worker: its share of the store filled"
	}
	return "its part of the checkpoint fetched"
}

var logInt = regexp.MustCompile(`\b(share_bytes|fetched_bytes)=(\d+)`)

// fillRig starts the rig's nodes on their own directories (workers, the
// stages and the shadow with its stages, each fetching from the main
// node) and a main node serving the weights and the API (-http: no
// request comes; it dials every node and tells each worker its place,
// which then fills its share in the background), waits until every node
// has logged that it has its share, and stops them all. start numbers
// the logs' directory (logs/fill-START).
func fillRig(opt BenchOptions, start int) (FillStart, error) {
	logDir := filepath.Join(opt.Out, "logs", fmt.Sprintf("fill-%d", start))
	mode := ModeReactive
	if opt.Rig.Shadow != nil {
		mode = ModeShadow
	}
	t0 := time.Now()
	servers, err := StartServers(opt, mode, logDir)
	defer func() { StopAll(servers, 10*time.Second) }()
	if err != nil {
		return FillStart{}, err
	}
	mf := MainFlags(opt, mode)
	mf.HTTP = "127.0.0.1:0" // serving until stopped, answering nothing
	// as a main node started by hand: it waits long for the workers and
	// stages fetching from it, not for the shadow
	mf.DialTimeout = wire.DefaultStartDialTimeout
	log, err := os.OpenFile(filepath.Join(logDir, opt.Rig.Main.Name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return FillStart{}, err
	}
	defer log.Close()
	mp, err := opt.mainVia().Start(opt.Rig.Main, mf.Args(), log)
	if err != nil {
		return FillStart{}, err
	}
	defer mp.Stop(10 * time.Second)
	opt.Log.Info().Int("start", start).Int("nodes", len(servers)).Str("logs", logDir).Msg("rig nodes started on their own directories, fetching from the main node")

	var fs FillStart
	seen := map[string]bool{}
	deadline := t0.Add(rigDialTimeout)
	for len(seen) < len(servers) {
		for _, p := range servers {
			n := p.Node
			if seen[n.Name] {
				continue
			}
			b, _ := os.ReadFile(filepath.Join(logDir, n.Name+".log"))
			i := bytes.Index(b, []byte(fillMark(n)))
			if i < 0 {
				if p.Exited() {
					return fs, fmt.Errorf("testbed: %s %w before it had its share; its log: %s", n.Name, errExited, filepath.Join(logDir, n.Name+".log"))
				}
				continue
			}
			line, _, _ := bytes.Cut(b[i:], []byte("\n"))
			fn := FillNode{Name: n.Name, Role: n.RunRole(), ReadyS: time.Since(t0).Seconds()}
			for _, m := range logInt.FindAllSubmatch(line, -1) {
				v, _ := strconv.ParseInt(string(m[2]), 10, 64)
				if string(m[1]) == "share_bytes" {
					fn.ShareBytes = v
				} else {
					fn.FetchedBytes = v
				}
			}
			seen[n.Name] = true
			fs.Nodes = append(fs.Nodes, fn)
			fs.ReadyS = fn.ReadyS
		}
		if mp.Exited() {
			return fs, fmt.Errorf("testbed: the main node %w while the nodes filled; its log: %s", errExited, filepath.Join(logDir, opt.Rig.Main.Name+".log"))
		}
		if fs.ServingS == 0 {
			if b, _ := os.ReadFile(filepath.Join(logDir, opt.Rig.Main.Name+".log")); bytes.Contains(b, []byte(serve.ServingMessage)) {
				fs.ServingS = time.Since(t0).Seconds()
			}
		}
		if time.Now().After(deadline) {
			return fs, fmt.Errorf("testbed: the nodes did not all have their shares within %v; logs in %s", rigDialTimeout, logDir)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fs, nil
}

// linkBits is the emulated rig's link rate in bits a second (its state's
// rate: 1gbit, 100mbit, ...), 0 if it says none.
func linkBits(state map[string]string) float64 {
	r := strings.ToLower(state["rate"])
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if v, ok := strings.CutSuffix(r, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0
			}
			return f * u.mult
		}
	}
	return 0
}
