package wire

import (
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"
)

// ErrorCode says why a connection was closed. It travels as the QUIC
// application error code of the CONNECTION_CLOSE frame, so both ends log
// the same reason.
type ErrorCode uint64

// The error codes of the wire protocol. Values are part of the protocol:
// never renumber them.
const (
	CodeClosed        ErrorCode = 0x00 // clean shutdown
	CodeInternal      ErrorCode = 0x01 // a bug or resource failure on the closing side
	CodeFrameTooLarge ErrorCode = 0x10 // a frame longer than the receiver's MaxFrameBytes
	CodeMalformed     ErrorCode = 0x11 // a frame or message that does not decode
	CodeUnknownType   ErrorCode = 0x12 // a message type this build does not know
	CodeBadVersion    ErrorCode = 0x13 // a protocol version this build does not speak
	CodeBadTensor     ErrorCode = 0x14 // a tensor whose bytes do not match its dtype and shape
	CodeIdentity      ErrorCode = 0x15 // a peer whose name or role is not the expected one
	CodeProtocol      ErrorCode = 0x16 // streams or messages out of the protocol's order
	codeTooMany       ErrorCode = 0x17 // past the listener's connection caps (Config.MaxConns, MaxConnsPerIdentity)
	numCodes                    = 0x18
)

var codeNames = map[ErrorCode]string{
	CodeClosed:        "closed",
	CodeInternal:      "internal error",
	CodeFrameTooLarge: "frame too large",
	CodeMalformed:     "malformed message",
	CodeUnknownType:   "unknown message type",
	CodeBadVersion:    "unsupported protocol version",
	CodeBadTensor:     "inconsistent tensor",
	CodeIdentity:      "wrong peer identity",
	CodeProtocol:      "protocol violation",
	codeTooMany:       "too many connections",
}

func (c ErrorCode) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("error code %#x", uint64(c))
}

// ConnError is why a connection ended: a protocol error detected here
// (Remote false) or announced by the peer when it closed the connection
// (Remote true). errors.Is matches it against the Err* values by code,
// so errors.Is(err, wire.ErrBadTensor) holds on both ends.
type ConnError struct {
	Code   ErrorCode
	Remote bool   // the peer closed the connection with this code
	Reason string // human-readable detail, also sent to the peer
	Err    error  // the underlying cause, if any (local errors only)
}

// Sentinels for errors.Is; they compare by Code only.
var (
	ErrClosed        = &ConnError{Code: CodeClosed}
	ErrInternal      = &ConnError{Code: CodeInternal}
	ErrFrameTooLarge = &ConnError{Code: CodeFrameTooLarge}
	ErrMalformed     = &ConnError{Code: CodeMalformed}
	ErrUnknownType   = &ConnError{Code: CodeUnknownType}
	ErrBadVersion    = &ConnError{Code: CodeBadVersion}
	ErrBadTensor     = &ConnError{Code: CodeBadTensor}
	ErrIdentity      = &ConnError{Code: CodeIdentity}
	ErrProtocol      = &ConnError{Code: CodeProtocol}
)

// ErrTimeout is matched (errors.Is) by the error of a peer that went
// silent for longer than the idle timeout: crashed, unplugged, or cut off.
var ErrTimeout = errors.New("wire: peer silent for longer than the idle timeout")

func (e *ConnError) Error() string {
	s := "wire: " + e.Code.String()
	if e.Remote {
		s += " (reported by peer)"
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.Err != nil && e.Reason == "" {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches any *ConnError with the same Code.
func (e *ConnError) Is(target error) bool {
	t, ok := target.(*ConnError)
	return ok && t.Code == e.Code
}

func (e *ConnError) Unwrap() error { return e.Err }

// connErrorf makes a local protocol error.
func connErrorf(code ErrorCode, cause error, format string, a ...any) *ConnError {
	return &ConnError{Code: code, Reason: fmt.Sprintf(format, a...), Err: cause}
}

// fromQUIC turns an error from quic-go into the one Peer methods return:
// a close by the peer becomes a *ConnError with Remote set, an idle
// timeout wraps ErrTimeout; anything else is returned as is.
func fromQUIC(err error) error {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) {
		return &ConnError{Code: ErrorCode(ae.ErrorCode), Remote: ae.Remote, Reason: ae.ErrorMessage}
	}
	var it *quic.IdleTimeoutError
	if errors.As(err, &it) {
		return fmt.Errorf("%w (%v)", ErrTimeout, err)
	}
	return err
}
