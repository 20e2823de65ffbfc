package wire

import (
	"fmt"
	"slices"
	"strings"
)

// Role is what a node does in the swarm. It is part of the node's
// certificate, so a node cannot claim another role than the one the
// cluster's certificate authority gave it.
type Role string

// The roles of a swarm (DESIGN.md "The three roles").
const (
	RoleMain   Role = "main"
	RoleShadow Role = "shadow"
	RoleWorker Role = "worker"
)

var roles = []Role{RoleMain, RoleShadow, RoleWorker}

// Valid reports whether r is one of the roles above.
func (r Role) Valid() bool { return slices.Contains(roles, r) }

// ParseRole parses a role name ("main", "shadow" or "worker").
func ParseRole(s string) (Role, error) {
	r := Role(strings.ToLower(strings.TrimSpace(s)))
	if !r.Valid() {
		return "", fmt.Errorf("wire: unknown role %q (want main, shadow or worker)", s)
	}
	return r, nil
}

// InferRole guesses a node's role from its name: "main" is the main node
// ("stage", "stage1", "stage2", ...: its stages, which meet the workers
// as it does), "shadow" (and "shadow2", "shadow3", ...: a staged
// shadow's stages) a shadow node, and "w1", "w2", ..., "worker-a", ...
// are workers.
// Any other name needs an explicit role (NAME=ROLE in ParseNodes).
func InferRole(name string) (Role, bool) {
	switch {
	case name == "main", strings.HasPrefix(name, "stage") && strings.Trim(name[len("stage"):], "0123456789") == "":
		return RoleMain, true // stage, stage1, stage2, ...: a staged main node's stages
	case name == "shadow", strings.HasPrefix(name, "shadow") && strings.Trim(name[len("shadow"):], "0123456789") == "":
		return RoleShadow, true // shadow2, shadow3, ...: a staged shadow's stages
	case strings.HasPrefix(name, "worker"):
		return RoleWorker, true
	case len(name) > 1 && name[0] == 'w' && strings.Trim(name[1:], "0123456789") == "":
		return RoleWorker, true
	}
	return "", false
}

// Identity names a node of the swarm. With certificates it is read from
// the peer's verified certificate; with Config.Insecure it is whatever
// the peer claims in its Hello.
type Identity struct {
	Name string
	Role Role
}

func (id Identity) String() string { return id.Name + "/" + string(id.Role) }

// validName reports whether name can name a node: it becomes a file name
// (NAME.pem) and a DNS name in the node's certificate, so it is 1-63
// letters, digits and inner hyphens, and not "ca".
func validName(name string) bool {
	if len(name) == 0 || len(name) > 63 || name == "ca" {
		return false
	}
	for i, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(name)-1:
		default:
			return false
		}
	}
	return true
}
