package wire

import (
	"os"
	"testing"
)

var testTempDir string

func TestMain(m *testing.M) {
	var err error
	testTempDir, err = os.MkdirTemp("", "odmoe-wire-test-")
	if err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(testTempDir)
	os.Exit(code)
}
