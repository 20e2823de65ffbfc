package mainnode

import (
	"context"

	"github.com/odmoe/odmoe/model"
)

// Generate is model.Generate on the swarm: sess, whose expert runner is
// s, runs prompt and samples up to opt.MaxTokens tokens; before every
// forward pass the shadow (if any) is departed and aligned, and at the end
// the sequence is ended on the workers and the shadow. Read ShadowStats
// and CollectTrace after it: what they report outlives the sequence.
func (s *Swarm) Generate(ctx context.Context, sess *model.Session, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error) {
	user := opt.BeforeForward
	opt.BeforeForward = func(step model.Step, tokens []int) error {
		if err := s.BeforeForward(ctx, step, tokens, sess.Cache()); err != nil {
			return err
		}
		if user != nil {
			return user(step, tokens)
		}
		return nil
	}
	ids, st, err := model.Generate(ctx, sess, prompt, opt)
	if endErr := s.EndSequence(ctx, sess.Seq()); err == nil {
		err = endErr
	}
	return ids, st, err
}
