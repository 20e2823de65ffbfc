package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeBlock is one ```sh block of README.md or a guide in docs/: its
// command lines (a trailing backslash joins the next line) and what the
// comment line just before it says about running it in a test.
type readmeBlock struct {
	file     string
	line     int      // where it starts in file
	commands []string // comments stripped
	skip     string   // why the test does not run it ("" = it runs)
}

// where is the block's place, file:line.
func (b readmeBlock) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// guides are the documents whose blocks the test runs after README.md's,
// in this order: the order their sections had in the README, each
// building on what the one before made (/tmp/tiny, certs, workers). Any
// other docs/*.md follows, in name order.
var guides = []string{"docs/models.md", "docs/serving.md", "docs/shadow.md", "docs/residency.md", "docs/failures.md",
	"docs/rigs.md", "docs/planning.md", "docs/kernels.md", "docs/store.md", "docs/certificates.md"}

// documents are README.md, guides, then the rest of docs/*.md.
func documents(t *testing.T) []string {
	t.Helper()
	all, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs := append([]string{"README.md"}, guides...)
	for _, f := range all {
		if !slices.Contains(docs, f) {
			docs = append(docs, f)
		}
	}
	return docs
}

// readmeBlocks parses file. A block preceded by the comment
// `<!-- readme-test: skip: REASON -->` is one the document says needs
// what a test machine lacks (root, a rig) or what CI runs anyway.
func readmeBlocks(t *testing.T, file string) []readmeBlock {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []readmeBlock
	var cur *readmeBlock
	prev, pending := "", ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```sh"):
			cur = &readmeBlock{file: file, line: n}
			if m := skipComment.FindStringSubmatch(prev); m != nil {
				cur.skip = m[1]
			}
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			text := pending + stripComment(line)
			if strings.HasSuffix(text, `\`) {
				pending = strings.TrimSuffix(text, `\`) + " "
				continue
			}
			pending = ""
			if strings.TrimSpace(text) != "" {
				cur.commands = append(cur.commands, strings.TrimSpace(text))
			}
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

var skipComment = regexp.MustCompile(`^<!-- readme-test: skip: (.+) -->$`)

// stripComment drops a shell comment that starts after two spaces (the
// README's style), keeping quoted '#'s alone.
func stripComment(line string) string {
	if i := strings.Index(line, "  #"); i >= 0 && strings.Count(line[:i], "'")%2 == 0 && strings.Count(line[:i], `"`)%2 == 0 {
		return strings.TrimRight(line[:i], " ")
	}
	return line
}

// server reports whether a README command starts a node that serves until
// stopped (a worker, a shadow or a stage: the README runs each on its
// own machine, or in its own terminal).
func server(cmd string) bool {
	return strings.Contains(cmd, "-role worker") || strings.Contains(cmd, "-role shadow") || strings.Contains(cmd, "-role stage")
}

// TestReadmeCommandsRunAsWritten runs every ```sh block of README.md and
// of docs/ (documents), in order, as a newcomer would on a fresh clone: the binary is the one
// `go build -o bin/odmoe .` makes, servers (workers, the shadow) run in
// the background as if in their own terminals, everything else must exit
// 0. The README's /tmp paths are moved into the test's directory so
// parallel runs do not collide; blocks the README marks as needing root or
// a rig are skipped and listed. The cmp block checks that the swarm's
// logits are local mode's.
func TestReadmeCommandsRunAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every README command, ~1 minute")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(odmoeBin(t), filepath.Join(dir, "bin", "odmoe")); err != nil {
		t.Fatal(err)
	}
	// the checkout's own files a block may name (a model's config.json, a
	// device), as in a clone
	for _, d := range []string{"testdata", "testbed"} {
		abs, err := filepath.Abs(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	var servers []*exec.Cmd
	defer func() {
		for _, s := range servers {
			s.Process.Signal(syscall.SIGTERM)
			s.Wait()
		}
	}()
	tmp := filepath.Join(dir, "tmp") + "/"
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	ran := 0
	var blocks []readmeBlock
	for _, doc := range documents(t) {
		blocks = append(blocks, readmeBlocks(t, doc)...)
	}
	for _, b := range blocks {
		if b.skip != "" {
			t.Logf("%s skipped: %s", b.where(), b.skip)
			continue
		}
		for _, c := range b.commands {
			if c == "go build -o bin/odmoe ." {
				continue // the test built it (odmoeBin), from this checkout
			}
			c = strings.ReplaceAll(c, "/tmp/", tmp)
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", c)
			cmd.Dir = dir
			// the system's python3 first: the one Debian's python3-numpy
			// (the README's numpy line) serves, which CI installs
			cmd.Env = append(os.Environ(), "PATH=/usr/bin:"+os.Getenv("PATH"))
			logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("cmd-%d.log", ran)))
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout, cmd.Stderr = logf, logf
			ran++
			if server(c) {
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				servers = append(servers, cmd)
				t.Logf("%s started: %s", b.where(), c)
				continue
			}
			start := time.Now()
			err = cmd.Run()
			logf.Close()
			out, _ := os.ReadFile(logf.Name())
			if err != nil {
				t.Fatalf("%s: %s\n%v\n%s", b.where(), c, err, out)
			}
			t.Logf("%s ran in %.1fs: %s", b.where(), time.Since(start).Seconds(), c)
		}
	}
	if ran == 0 {
		t.Fatal("no README command ran")
	}
}

// TestReadmeIsAFrontPage: README.md is at most 250 lines; its first
// headings are what a newcomer looks for (requirements, the two
// commands, serving, a real rig, the documentation's index); every
// document it links is there, and every guide in docs/ is in the index
// and in the test's order (guides).
func TestReadmeIsAFrontPage(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	if n := strings.Count(text, "\n"); n > 250 {
		t.Errorf("README.md is %d lines, at most 250", n)
	}
	var headings []string
	for _, line := range strings.Split(text, "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			headings = append(headings, h)
		}
	}
	for _, want := range []string{"Requirements", "Two commands", "Serve it", "Run it on real machines", "Documentation"} {
		if i := slices.Index(headings, want); i < 0 || i > 6 {
			t.Errorf("README's heading %q is not among its first seven (%q)", want, headings)
		}
	}
	for _, m := range regexp.MustCompile(`\]\((docs/[^)#]+)\)`).FindAllStringSubmatch(text, -1) {
		if _, err := os.Stat(m[1]); err != nil {
			t.Errorf("README links %s: %v", m[1], err)
		}
	}
	for _, g := range guides {
		if !strings.Contains(text, "]("+g+")") {
			t.Errorf("the guide %s is not in README's index", g)
		}
		if _, err := os.Stat(g); err != nil {
			t.Errorf("guide %s: %v", g, err)
		}
	}
}
