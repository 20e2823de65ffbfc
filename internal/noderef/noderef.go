// Package noderef finds, for tests, the Node.js reference implementations
// odmoe is checked against (Hugging Face's tokenizers and jinja, the
// official openai client): node itself and an npm package installed in a
// node_modules folder. A missing one skips the test, or fails it when
// CI=true, where everything must be installed.
package noderef

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TokrefModules is the node_modules folder of testdata/tokref, from a
// package whose directory is root (the repository's root, relative):
// $ODMOE_TOKREF_DIR (the folder, or the prefix holding it) if set, else
// root/testdata/tokref/node_modules.
func TokrefModules(root string) string {
	dir := os.Getenv("ODMOE_TOKREF_DIR")
	if dir == "" {
		dir = filepath.Join(root, "testdata", "tokref", "node_modules")
	}
	return nested(dir)
}

// nested is dir's own node_modules folder where it has one (dir is an
// npm prefix), else dir.
func nested(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err == nil {
		return filepath.Join(dir, "node_modules")
	}
	return dir
}

// Require returns modules as an absolute path and node, once modules
// (or its own node_modules folder, where a prefix was given) holds the
// npm package pkg; install is the command that installs it, for the
// message when it does not.
func Require(t testing.TB, modules, pkg, install string) (abs, node string) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...) + "; run `" + install + "`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	modules = nested(modules)
	if _, err := os.Stat(filepath.Join(modules, pkg, "package.json")); err != nil {
		missing("the npm package %s is not installed in %s", pkg, modules)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not installed")
	}
	if abs, err = filepath.Abs(modules); err != nil {
		t.Fatal(err)
	}
	return abs, node
}
