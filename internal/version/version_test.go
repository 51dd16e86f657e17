package version

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFromBuildInfo(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}
	tests := []struct {
		name   string
		linked Info
		bi     debug.BuildInfo
		want   Info
	}{
		{"nothing recorded (-buildvcs=false, go build)", Info{}, debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Info{}},
		{"the toolchain's VCS stamp", Info{}, debug.BuildInfo{Settings: vcs}, Info{Revision: "abc123", Modified: true}},
		{"go install module@version", Info{}, debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}}, Info{Version: "v0.4.0"}},
		{"linker flags win", Info{Version: "v0.5.0-rc1", Revision: "def456"},
			debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}, Settings: vcs}, Info{Version: "v0.5.0-rc1", Revision: "def456"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, fromBuildInfo(tc.linked, &tc.bi)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestGet_UnknownNotEmpty(t *testing.T) {
	// A test binary has no linker flags and, under -buildvcs=false, no VCS stamp: the fields
	// say unknown rather than nothing.
	i := Get()
	if i.Version == "" || i.Revision == "" || i.GoVersion == "" {
		t.Errorf("Get() = %+v: no field may be empty", i)
	}
	if s := i.String(); !strings.HasPrefix(s, "kvroute "+i.Version+" revision "+i.Revision) {
		t.Errorf("String() = %q", s)
	}
	if got := (Info{Version: "v1", Revision: "r", Modified: true, GoVersion: "go1.26.8"}).String(); got != "kvroute v1 revision r (modified) go1.26.8" {
		t.Errorf("String() = %q", got)
	}
}
