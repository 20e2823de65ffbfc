package model

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/model/synth"
)

// eachFamily runs test on each family's tiny preset, generated with seed.
func eachFamily(t *testing.T, seed uint64, test func(t *testing.T, m *Model)) {
	eachFamilyIn(t, seed, func(t *testing.T, _ string, m *Model) { test(t, m) })
}

// eachFamilyIn is eachFamily, test also given the checkpoint's directory.
func eachFamilyIn(t *testing.T, seed uint64, test func(t *testing.T, dir string, m *Model)) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), preset)
			if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: seed}); err != nil {
				t.Fatal(err)
			}
			m, err := Load(dir, LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			test(t, dir, m)
		})
	}
}

// aloneLogits runs each prompt alone, greedy, one token per Forward:
// the logits after the prompt and after each of steps-1 tokens.
func aloneLogits(t *testing.T, m *Model, prompts [][]int, steps int) [][][]float32 {
	t.Helper()
	want := make([][][]float32, len(prompts))
	for i, p := range prompts {
		s := NewSession(m, NewResidentExperts(m), len(p)+steps)
		logits, err := s.Forward(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		for range steps {
			want[i] = append(want[i], slices.Clone(logits))
			if logits, err = s.Forward(context.Background(), []int{Argmax(logits)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return want
}

// TestBatchedDecodeIsEachSequenceAlone decodes three sequences of every
// family together, with members joining and leaving between passes, and
// checks every pass's logits (every other pass from Batch.Logits, the
// others from each session's Logits) against the same sequence decoded
// alone, bit for bit.
func TestBatchedDecodeIsEachSequenceAlone(t *testing.T) {
	eachFamily(t, 11, func(t *testing.T, m *Model) {
		ctx := context.Background()
		prompts := [][]int{{1, 17, 300, 42}, {5, 77}, {9, 250, 100, 64, 3, 8}}
		const steps = 6
		want := aloneLogits(t, m, prompts, steps)
		// together: sequence 2 joins one pass late, sequence 1 leaves
		// two passes early
		sessions := make([]*Session, len(prompts))
		got := make([][][]float32, len(prompts))
		for i, p := range prompts {
			sessions[i] = NewSession(m, NewResidentExperts(m), 16)
			logits, err := sessions[i].Forward(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = append(got[i], slices.Clone(logits))
		}
		b := NewBatch(m, NewResidentExperts(m))
		for pass := range steps + 1 {
			var members []*Session
			var tokens [][]int
			for i, s := range sessions {
				if (i == 2 && pass == 0) || (i == 1 && pass >= steps-2) || len(got[i]) >= steps {
					continue
				}
				members = append(members, s)
				tokens = append(tokens, []int{Argmax(got[i][len(got[i])-1])})
			}
			if len(members) == 0 {
				continue
			}
			if err := b.Forward(ctx, members, tokens); err != nil {
				t.Fatal(err)
			}
			if pass%2 == 0 { // the head of every row in one product; else each session's own
				if err := b.Logits(members); err != nil {
					t.Fatal(err)
				}
			}
			for i, s := range sessions {
				if slices.Contains(members, s) {
					got[i] = append(got[i], slices.Clone(s.Logits()))
				}
			}
		}
		// sequence 1 left early: finish it alone
		for len(got[1]) < steps {
			logits, err := sessions[1].Forward(ctx, []int{Argmax(got[1][len(got[1])-1])})
			if err != nil {
				t.Fatal(err)
			}
			got[1] = append(got[1], slices.Clone(logits))
		}
		for i := range prompts {
			for step := range steps {
				if d := firstDiff(got[i][step], want[i][step]); d >= 0 {
					t.Fatalf("sequence %d step %d: logit %d is %v batched, %v alone", i, step, d, got[i][step][d], want[i][step][d])
				}
			}
		}
	})
}

// TestChunkedPromptsInPassesAreEachSequenceAlone feeds three prompts of
// every family in chunks of up to 4 tokens, in passes that also carry the
// other sequences' decode steps (one joins two passes late), and checks
// the logits after each prompt and each decode step against the same
// sequence run alone (its whole prompt in one Forward), bit for bit.
func TestChunkedPromptsInPassesAreEachSequenceAlone(t *testing.T) {
	eachFamily(t, 12, func(t *testing.T, m *Model) {
		ctx := context.Background()
		prompts := [][]int{{1, 17, 300, 42, 8, 9, 10, 11, 12}, {5, 77, 6}, {9, 250, 100, 64, 3, 8, 2, 4, 6, 8, 10, 12}}
		const steps, chunk = 4, 4
		want := aloneLogits(t, m, prompts, steps)
		sessions := make([]*Session, len(prompts))
		for i := range sessions {
			sessions[i] = NewSession(m, nil, 32) // a batch member's own runner never runs
		}
		got := make([][][]float32, len(prompts))
		fed := make([]int, len(prompts))
		b := NewBatch(m, NewResidentExperts(m))
		for pass := 0; ; pass++ {
			var members []*Session
			var feeds [][]int
			var heads []int
			for i, s := range sessions {
				if (i == 2 && pass < 2) || len(got[i]) >= steps {
					continue
				}
				members = append(members, s)
				if p := prompts[i]; fed[i] < len(p) {
					n := min(chunk, len(p)-fed[i])
					feeds = append(feeds, p[fed[i]:fed[i]+n])
					if fed[i] += n; fed[i] == len(p) {
						heads = append(heads, i)
					}
				} else {
					feeds = append(feeds, []int{Argmax(got[i][len(got[i])-1])})
					heads = append(heads, i)
				}
			}
			if len(members) == 0 {
				break
			}
			if err := b.Forward(ctx, members, feeds); err != nil {
				t.Fatal(err)
			}
			for _, i := range heads {
				got[i] = append(got[i], slices.Clone(sessions[i].Logits()))
			}
		}
		for i := range prompts {
			for step := range steps {
				if d := firstDiff(got[i][step], want[i][step]); d >= 0 {
					t.Fatalf("sequence %d step %d: logit %d is %v chunked in passes, %v alone", i, step, d, got[i][step][d], want[i][step][d])
				}
			}
		}
	})
}

func TestBatchRefusesMismatchedInput(t *testing.T) {
	m := loadTiny(t)
	b := NewBatch(m, NewResidentExperts(m))
	s := NewSession(m, NewResidentExperts(m), 4)
	if err := b.Forward(context.Background(), []*Session{s}, [][]int{{1}, {2}}); err == nil {
		t.Fatal("one session with two feeds was accepted")
	}
	if err := b.Forward(context.Background(), []*Session{s}, [][]int{{}}); err == nil {
		t.Fatal("a member feeding no tokens was accepted")
	}
	if err := b.Forward(context.Background(), []*Session{s, s}, [][]int{{1}, {2}}); err == nil {
		t.Fatal("one session as two members was accepted")
	}
	if err := b.Forward(context.Background(), []*Session{s}, [][]int{{1, m.Config.VocabSize}}); err == nil {
		t.Fatal("a token outside the vocabulary was accepted")
	}
	if err := b.Logits([]*Session{s}); err == nil {
		t.Fatal("Logits of a session that no pass ran was accepted")
	}
	if err := b.Forward(context.Background(), []*Session{s}, [][]int{{1}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Logits([]*Session{s, NewSession(m, NewResidentExperts(m), 4)}); err == nil {
		t.Fatal("Logits of a session that no pass ran, beside one that did, was accepted")
	}
}

// TestGuessedRowsAreCheckedAsOneAtATime decodes a sequence of every
// family in passes that each feed its last token and up to three guesses
// of the tokens after it (some right, one wrong where the pass says),
// beside another sequence decoding a token a pass: the logits after each
// fed row (LogitsOf, from Batch.Logits on even passes, else computed
// alone) are those of decoding one token at a time, bit for bit, up to
// the first wrong guess, and the rows after it taken back (Truncate)
// leave the sequence as if they had never been fed.
func TestGuessedRowsAreCheckedAsOneAtATime(t *testing.T) {
	eachFamily(t, 13, func(t *testing.T, m *Model) {
		ctx := context.Background()
		prompts := [][]int{{9, 250, 100, 64, 3, 8}, {1, 17, 300, 42}}
		const steps = 40 // past gpt-oss-tiny's window of 8 and the rows it drops (kvcache.Commit)
		want := aloneLogits(t, m, prompts, steps)
		tokens := make([][]int, len(prompts))
		for i := range prompts {
			for _, lg := range want[i] {
				tokens[i] = append(tokens[i], Argmax(lg))
			}
		}
		sessions := make([]*Session, len(prompts))
		out := make([][]int, len(prompts))
		for i, p := range prompts {
			sessions[i] = NewSession(m, NewResidentExperts(m), 8)
			logits, err := sessions[i].Forward(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = append(out[i], Argmax(logits))
		}
		b := NewBatch(m, NewResidentExperts(m))
		guessed, wrong := 0, 0
		for pass := 0; len(out[0]) < steps; pass++ {
			k := min(1+pass%3, steps-len(out[0])) // guesses this pass
			guesses := slices.Clone(tokens[0][len(out[0]) : len(out[0])+k])
			if w := pass % 4; w < k { // this guess is wrong; pass%4 == 3 (or past k): all right
				guesses[w] = (guesses[w] + 1) % m.Config.VocabSize
				wrong++
			}
			guessed += k
			s0 := sessions[0]
			before := s0.Len()
			s0.KeepRows(k + 1)
			members, feeds := []*Session{s0}, [][]int{append([]int{out[0][len(out[0])-1]}, guesses...)}
			if len(out[1]) < steps {
				members, feeds = append(members, sessions[1]), append(feeds, out[1][len(out[1])-1:])
			}
			if err := b.Forward(ctx, members, feeds); err != nil {
				t.Fatal(err)
			}
			if pass%2 == 0 {
				if err := b.Logits(members); err != nil {
					t.Fatal(err)
				}
			}
			if s0.Kept() != k+1 || (len(members) > 1 && sessions[1].Kept() != 1) {
				t.Fatalf("pass %d kept %d and %d rows, want %d and 1", pass, s0.Kept(), sessions[1].Kept(), k+1)
			}
			used := 0
			for j := 0; j <= k; j++ {
				lg := s0.LogitsOf(j)
				if d := firstDiff(lg, want[0][len(out[0])]); d >= 0 {
					t.Fatalf("pass %d row %d (token %d): logit %d is %v checked, %v one at a time", pass, j, len(out[0]), d, lg[d], want[0][len(out[0])][d])
				}
				id := Argmax(lg)
				out[0], used = append(out[0], id), j+1
				if j == k || id != guesses[j] || len(out[0]) >= steps {
					break
				}
			}
			s0.Cache().Truncate(before + used)
			if len(members) > 1 {
				lg := sessions[1].Logits()
				if d := firstDiff(lg, want[1][len(out[1])]); d >= 0 {
					t.Fatalf("pass %d, the other sequence's token %d: logit %d is %v, %v alone", pass, len(out[1]), d, lg[d], want[1][len(out[1])][d])
				}
				out[1] = append(out[1], Argmax(lg))
			}
		}
		if !slices.Equal(out[0], tokens[0]) {
			t.Fatalf("checked guesses decoded %v, one at a time %v", out[0], tokens[0])
		}
		if wrong == 0 || wrong == guessed {
			t.Fatalf("%d of %d guesses wrong: the test checks neither a kept nor a taken-back row", wrong, guessed)
		}
	})
}

// TestAPromptsLogitsTakeOneRowOfVocabulary: a session fed a long prompt
// alone keeps every row's hidden state (LogitsOf), but its Logits take
// one vocabulary's worth of floats, not one a row (a 4k-token prompt of
// Qwen3's 151,936 tokens would be 2.5 GB), and LogitsOf of an earlier
// row is that prompt's prefix's logits.
func TestAPromptsLogitsTakeOneRowOfVocabulary(t *testing.T) {
	eachFamily(t, 14, func(t *testing.T, m *Model) {
		ctx := context.Background()
		prompt := make([]int, 200)
		for i := range prompt {
			prompt[i] = (i*37 + 5) % m.Config.VocabSize
		}
		s := NewSession(m, NewResidentExperts(m), len(prompt))
		logits, err := s.Forward(ctx, prompt)
		if err != nil {
			t.Fatal(err)
		}
		if V := m.Config.VocabSize; len(logits) != V || cap(s.logits) >= 2*V {
			t.Fatalf("logits of %d floats, %d held, for a vocabulary of %d", len(logits), cap(s.logits), V)
		}
		last := slices.Clone(logits)
		mid := slices.Clone(s.LogitsOf(99))
		alone, err := NewSession(m, NewResidentExperts(m), 100).Forward(ctx, prompt[:100])
		if err != nil {
			t.Fatal(err)
		}
		if d := firstDiff(mid, alone); d >= 0 {
			t.Fatalf("LogitsOf(99): logit %d is %v, the 100-token prompt's %v", d, mid[d], alone[d])
		}
		if d := firstDiff(s.Logits(), last); d >= 0 {
			t.Fatalf("Logits after LogitsOf(99): logit %d is %v, was %v", d, s.Logits()[d], last[d])
		}
	})
}
