package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file of a layer.
type entry struct {
	Name     string
	Type     byte
	Mode     int64
	UID, GID int
}

// files lists img's layers' entries and returns the content of BinaryPath.
func files(t *testing.T, img v1.Image) ([]entry, []byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mt, err := layers[0].MediaType(); err != nil || mt != types.OCILayer {
		t.Errorf("layer media type %q (%v), want %q", mt, err, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out []entry
	var bin []byte
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid})
		if "/"+h.Name == BinaryPath {
			if bin, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out, bin
}

// checkImage checks what every kvroute image must be; want are the labels' version and revision.
func checkImage(t *testing.T, img v1.Image, version, revision string) []byte {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", c.User)
	}
	if diff := cmp.Diff([]string{"/usr/local/bin/kvroute"}, c.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"PATH=/usr/local/bin"}, c.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
		"org.opencontainers.image.source":   "https://github.com/kvroute/kvroute",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.title":    "kvroute",
	} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	if _, err := time.Parse(time.RFC3339, c.Labels["org.opencontainers.image.created"]); err != nil {
		t.Errorf("label created: %v", err)
	}
	if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %q (%v)", mt, err)
	}
	got, bin := files(t, img)
	want := []entry{
		{"usr/", tar.TypeDir, 0o755, 0, 0},
		{"usr/local/", tar.TypeDir, 0o755, 0, 0},
		{"usr/local/bin/", tar.TypeDir, 0o755, 0, 0},
		{"usr/local/bin/kvroute", tar.TypeReg, 0o755, 0, 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer: the binary, root-owned 0755, and nothing else (-want +got):\n%s", diff)
	}
	return bin
}

func fakeBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kvroute")
	if err := os.WriteFile(p, []byte("\x7fELF not really a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuild(t *testing.T) {
	o := Options{Binary: fakeBinary(t), Arch: "arm64", Version: "v0.4.0", Revision: "abc", Source: "https://github.com/kvroute/kvroute"}
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	bin := checkImage(t, img, "v0.4.0", "abc")
	if string(bin) != "\x7fELF not really a program" {
		t.Errorf("binary content %q", bin)
	}
	// The same inputs give the same image, byte for byte.
	again, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("digests %s and %s: the build is not reproducible", d1, d2)
	}
	o.Version = ""
	unknown, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if cf, _ := unknown.ConfigFile(); cf.Config.Labels["org.opencontainers.image.version"] != "unknown" {
		t.Errorf("no version: label %q, want unknown", cf.Config.Labels["org.opencontainers.image.version"])
	}

	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(Options{Binary: notELF}); err == nil || !strings.Contains(err.Error(), "not a Linux (ELF) binary") {
		t.Errorf("a shell script: %v, want it refused", err)
	}
	if _, err := Build(Options{Binary: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("a missing binary: no error")
	}
	if err := WriteTarball(filepath.Join(t.TempDir(), "x.tar"), img, []string{"Not A Tag!"}); err == nil {
		t.Error("a bad tag: no error")
	}
}

// TestMakeImage runs `make image` as a user would (a static build of the real binary, about
// 2 to 3 minutes on 2 cores with a cold cache), then checks the OCI layout and the tarball it
// wrote, runs the binary taken out of the image, and, when a Docker engine runs here, loads the
// tarball and runs the image.
func TestMakeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the static binary: skipped with -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const version, revision = "v9.9.9-test", "0123456789abcdef0123456789abcdef01234567"
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", root, "image", "IMAGE_DIR="+dir, "VERSION="+version,
		"REVISION="+revision, "IMAGE=kvroute-test/kvroute", "ARCH="+runtime.GOARCH)
	ownGroup(cmd)
	cmd.WaitDelay = 10 * time.Second // the pipes closed this long after a kill, whatever still holds them
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Logf("make image took %v", time.Since(start).Round(time.Second))

	idx, err := layout.ImageIndexFromPath(filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, d := range m.Manifests {
		refs = append(refs, d.Annotations["org.opencontainers.image.ref.name"])
	}
	if diff := cmp.Diff([]string{"kvroute-test/kvroute:" + version, "kvroute-test/kvroute:sha-0123456789ab"}, refs); diff != "" {
		t.Errorf("layout tags (-want +got):\n%s", diff)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	bin := checkImage(t, img, version, revision)

	// The docker-load tarball holds the same image.
	fromTar, err := tarball.ImageFromPath(filepath.Join(dir, "kvroute-image.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// (docker's format has its own manifest: compare the config, which names the layers.)
	c1, err1 := img.ConfigName()
	c2, err2 := fromTar.ConfigName()
	if err1 != nil || err2 != nil || c1 != c2 {
		t.Errorf("tarball image config %s (%v) differs from the layout's %s (%v)", c2, err2, c1, err1)
	}

	// Static: no program interpreter (dynamic loader) to find in an image without a libc.
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary asks for a dynamic loader: build it with CGO_ENABLED=0")
		}
	}
	if f.Machine != map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH] {
		t.Errorf("binary for %v, want %s", f.Machine, runtime.GOARCH)
	}

	// The binary says what the labels say.
	exe := filepath.Join(t.TempDir(), "kvroute")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, exe, "version", "--json").Output()
	if err != nil {
		t.Fatalf("kvroute version: %v", err)
	}
	var info struct {
		Version, Revision string
	}
	if err := json.Unmarshal(out, &info); err != nil || info.Version != version || info.Revision != revision {
		t.Errorf("kvroute version --json = %s (%v), want version %s revision %s", out, err, version, revision)
	}

	if exec.CommandContext(ctx, "docker", "info").Run() != nil {
		t.Log("no Docker engine here: the image was checked without running it")
		return
	}
	if out, err := exec.CommandContext(ctx, "docker", "load", "-i", filepath.Join(dir, "kvroute-image.tar")).CombinedOutput(); err != nil {
		t.Fatalf("docker load: %v\n%s", err, out)
	}
	tag := "kvroute-test/kvroute:" + version
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", tag, "kvroute-test/kvroute:sha-0123456789ab").Run() })
	out, err = exec.CommandContext(ctx, "docker", "run", "--rm", "--read-only", "--cap-drop=ALL", tag, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "kvroute "+version+" revision "+revision) {
		t.Errorf("docker run %s version: %v\n%s", tag, err, out)
	}
	out, err = exec.CommandContext(ctx, "docker", "run", "--rm", "--entrypoint", "id", tag).CombinedOutput()
	if err == nil {
		t.Errorf("the image has an id program (a shell or tools were meant to be absent): %s", out)
	}
}
