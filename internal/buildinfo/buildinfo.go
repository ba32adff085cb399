// Package buildinfo names the build of a binary: its module version and VCS
// revision, as the Go toolchain recorded them (verdictctl version, and the
// verdict-version header verdictd sends).
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Header is the response header of Status naming verdictd's build (Version):
// verdictctl version compares it with its own. It lives here, not in the
// server, so that verdictctl does not link the server to read it.
const Header = "verdict-version"

// Version is "v1.2.3", or "(devel)" for a build from a work tree, followed by
// the VCS revision ("(devel) 47e95c3b2a1f", "+dirty" when modified); "unknown"
// without build information.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && !strings.Contains(v, rev) {
		v += " " + rev + dirty
	}
	return v
}
