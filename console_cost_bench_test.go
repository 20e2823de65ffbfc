package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// BenchmarkConsoleCostToDecode measures what the console costs a swarm's
// decode: a swarm of processes (4 workers, an int8 shadow, the main node
// serving the API), and in each round one measurement with nothing
// attached, one with headless Chromium showing the console (its feed two
// snapshots a second), and one with a plain client reading the feed, in
// rotating order; each measurement is two streaming requests of 256
// greedy tokens one after the other, decode tokens/s taken from the
// first token to the last.
// Run it as: go test -run '^$' -bench ConsoleCost -benchtime 1x .
func BenchmarkConsoleCostToDecode(b *testing.B) {
	browser := chromium(b)
	s := startAPISwarm(b)
	root := strings.TrimSuffix(s.base, "/v1")
	const rounds, tokens = 3, 256
	// none, a browser showing the console, and a plain client reading the
	// console's feed (the node's whole part of a page open elsewhere,
	// without the browser's rendering on the swarm's cores)
	modes := []string{"none", "browser", "feed"}
	got := map[string][]float64{}
	for r := range rounds * b.N {
		for i := range modes {
			mode := modes[(i+r)%len(modes)]
			stop := func() {}
			switch mode {
			case "browser":
				stop = openConsole(b, browser, root)
			case "feed":
				stop = readFeed(b, root)
			}
			for range 2 {
				got[mode] = append(got[mode], streamDecode(b, s.base, tokens))
			}
			stop()
		}
	}
	none := median(got["none"])
	b.ReportMetric(none, "tok/s-without")
	b.ReportMetric(median(got["browser"])/none, "browser/none")
	b.ReportMetric(median(got["feed"])/none, "feed/none")
	b.Logf("decode tok/s: %v", got)
}

// readFeed reads the console's feed as the page does until stopped.
func readFeed(b *testing.B, root string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", root+"/console/events", nil)
	req.Header.Set("Authorization", "Bearer "+apiTestKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("the feed: %v %v", err, resp)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
		}
	}()
	return func() { cancel(); resp.Body.Close(); <-done }
}

// openConsole opens the console in headless Chromium, gives it the key,
// waits for its tiles, and returns what closes the browser.
func openConsole(b *testing.B, browser, root string) func() {
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU)...)
	ctx, cancel := chromedp.NewContext(alloc)
	wait, cancelWait := context.WithTimeout(ctx, time.Minute)
	defer cancelWait()
	if err := chromedp.Do(wait, chromedp.Navigate(root+"/"), chromedp.WaitVisible(chromedp.CSS(`#key-box`)),
		chromedp.SendKeys(chromedp.CSS(`#key`), apiTestKey), chromedp.Click(chromedp.CSS(`#key-save`)),
		chromedp.WaitVisible(chromedp.CSS(`.tile[data-node="w4"]`))); err != nil {
		b.Fatalf("open the console: %v", err)
	}
	return func() { cancel(); cancelAlloc() }
}

// streamDecode streams one greedy completion of n tokens and returns its
// decode rate: tokens after the first over the time after it.
func streamDecode(b *testing.B, base string, n int) float64 {
	body := fmt.Sprintf(`{"prompt": "The swarm", "max_tokens": %d, "temperature": 0, "ignore_eos": true, "stream": true}`, n)
	req, _ := http.NewRequest("POST", base+"/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiTestKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var first, last time.Time
	chunks := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && data != "[DONE]" && strings.Contains(data, `"text":"`) && !strings.Contains(data, `"text":""`) {
			if first.IsZero() {
				first = time.Now()
			}
			last = time.Now()
			chunks++
		}
	}
	if chunks < n/2 {
		b.Fatalf("%d chunks for %d tokens", chunks, n)
	}
	// chunks carry text; tokens are what the request generated
	return float64(n-1) / last.Sub(first).Seconds()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
