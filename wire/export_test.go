package wire

import (
	"context"

	"github.com/quic-go/quic-go"
)

// OpenRawStream opens a unidirectional stream on p's connection with
// nothing written on it: tests that play a hostile peer write what they
// like.
func (p *Peer) OpenRawStream(ctx context.Context) (*quic.SendStream, error) {
	return p.conn.OpenUniStreamSync(ctx)
}

// ClaimHeader is claimHeader for the external tests.
var ClaimHeader = claimHeader

// VmRSS is vmRSS for the external tests.
var VmRSS = vmRSS
