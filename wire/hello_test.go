package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCheckHelloRefusesAPeerOfAnotherModel: a node's CheckHello refuses a
// peer whose Hello says it serves another model; the dialer gets the
// reason (naming the refusing node and both models) at once, without
// retrying, whichever side refuses.
func TestCheckHelloRefusesAPeerOfAnotherModel(t *testing.T) {
	sameModel := func(mine string) func(_, peer *Hello) error {
		return func(_, h *Hello) error {
			if h.Model != mine {
				return fmt.Errorf("serves model %s, this node %s", h.Model, mine)
			}
			return nil
		}
	}
	for _, refuser := range []string{"listener", "dialer"} {
		t.Run(refuser, func(t *testing.T) {
			lcfg := testConfig(t, "hello", "w1", RoleMain)
			lcfg.Hello.Model = "aaaa"
			dcfg := testConfig(t, "hello", "main", RoleWorker)
			dcfg.Hello.Model = "bbbb"
			dcfg.DialAttempts = 5
			if refuser == "listener" {
				lcfg.CheckHello = sameModel("aaaa")
			} else {
				dcfg.CheckHello = sameModel("bbbb")
			}
			l := listen(t, lcfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			p, err := Dial(ctx, l.Addr().String(), dcfg)
			if err == nil {
				p.Close()
				t.Fatal("a peer of another model was accepted")
			}
			want := "w1 refuses main: serves model bbbb, this node aaaa"
			if refuser == "dialer" {
				want = "main refuses w1: serves model aaaa, this node bbbb"
			}
			if !strings.Contains(err.Error(), want) || !errors.Is(err, ErrIdentity) || strings.Contains(err.Error(), "5 attempts") {
				t.Fatalf("err = %v, want a refusal containing %q after one attempt", err, want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("refusal took %v", d)
			}
		})
	}
	// the same check passes a peer of the same model, and the Hello says which
	lcfg := testConfig(t, "hello", "w1", RoleMain)
	lcfg.Hello.Model, lcfg.CheckHello = "aaaa", sameModel("aaaa")
	dcfg := testConfig(t, "hello", "main", RoleWorker)
	dcfg.Hello.Model, dcfg.CheckHello = "aaaa", sameModel("aaaa")
	client, server := connect(t, listen(t, lcfg), dcfg)
	if client.Hello().Model != "aaaa" || server.Hello().Model != "aaaa" {
		t.Fatalf("hellos say models %q and %q", client.Hello().Model, server.Hello().Model)
	}
}
