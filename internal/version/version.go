// Package version says which build of kvroute is running: the version and VCS revision that
// the build stamped (make build and make image pass them with -ldflags -X, since the Go
// command's own VCS stamp is off where GOFLAGS has -buildvcs=false), else what the Go
// toolchain recorded, else "unknown".
package version

import (
	"cmp"
	"fmt"
	"runtime/debug"
)

// Set at link time, for example:
//
//	go build -ldflags "-X github.com/kvroute/kvroute/internal/version.version=v0.4.0 \
//	  -X github.com/kvroute/kvroute/internal/version.revision=$(git rev-parse HEAD)" ./cmd/kvroute
var (
	version  string
	revision string
	modified string // "true" when the work tree had changes
)

// Unknown stands for a value the build did not record.
const Unknown = "unknown"

// Info is what is known of the running build.
type Info struct {
	// Version is the release (v0.4.0), a git describe string, or Unknown.
	Version string `json:"version"`
	// Revision is the VCS commit, or Unknown.
	Revision string `json:"revision"`
	// Modified says the work tree had uncommitted changes when it was built.
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built it.
	GoVersion string `json:"go_version"`
}

// Get returns the running build's Info.
func Get() Info {
	info := Info{Version: version, Revision: revision, Modified: modified == "true"}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		info.GoVersion = bi.GoVersion
		info = fromBuildInfo(info, bi)
	}
	info.Version = cmp.Or(info.Version, Unknown)
	info.Revision = cmp.Or(info.Revision, Unknown)
	return info
}

// fromBuildInfo fills what the linker flags left empty from the toolchain's record: the module
// version (set by go install module@version) and the vcs.* settings (set unless -buildvcs=false).
func fromBuildInfo(info Info, bi *debug.BuildInfo) Info {
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	if info.Revision != "" {
		return info
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the one line `kvroute version` prints.
func (i Info) String() string {
	rev := i.Revision
	if i.Modified {
		rev += " (modified)"
	}
	return fmt.Sprintf("kvroute %s revision %s %s", i.Version, rev, cmp.Or(i.GoVersion, Unknown))
}

// UserAgent names kvroute and its version to the servers it calls (the Kubernetes API).
func UserAgent() string { return "kvroute/" + Get().Version }
