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

// BenchmarkConsoleCostToDecode measures what a browser showing the
// console costs a swarm's decode: a swarm of processes (4 workers, an
// int8 shadow, the main node serving the API), and in each round one
// measurement with headless Chromium showing the console (its feed two
// snapshots a second) and one without, in alternating order; each
// measurement is two streaming requests of 256 greedy tokens one after
// the other, decode tokens/s taken from the first token to the last.
// Run it as: go test -run '^$' -bench ConsoleCost -benchtime 1x .
func BenchmarkConsoleCostToDecode(b *testing.B) {
	browser := chromium(b)
	s := startAPISwarm(b)
	root := strings.TrimSuffix(s.base, "/v1")
	const rounds, tokens = 3, 256
	var with, without []float64
	for r := range rounds * b.N {
		for _, attached := range []bool{r%2 == 0, r%2 != 0} {
			stop := func() {}
			if attached {
				stop = openConsole(b, browser, root)
			}
			for range 2 {
				tps := streamDecode(b, s.base, tokens)
				if attached {
					with = append(with, tps)
				} else {
					without = append(without, tps)
				}
			}
			stop()
		}
	}
	mw, mo := median(with), median(without)
	b.ReportMetric(mw, "tok/s-with-console")
	b.ReportMetric(mo, "tok/s-without")
	b.ReportMetric(mw/mo, "ratio")
	b.Logf("with the console %v, without %v (decode tok/s)", with, without)
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
