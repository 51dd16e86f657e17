// Package image assembles kvroute's container image without a container engine: one layer
// holding the static binary, a config that runs it as an unprivileged user, and the OCI labels
// that say what was built from where. cmd-level wiring lives in tools/image (make image).
package image

import (
	"archive/tar"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed facts, which the Helm chart and the docs rely on.
const (
	// BinaryPath is where the binary lies in the image; it is the entrypoint.
	BinaryPath = "/usr/local/bin/kvroute"
	// User is the numeric user and group the process runs as (no passwd entry needed).
	User = "65532:65532"
	// UID is User's user id.
	UID = 65532
)

// Options say what goes into the image.
type Options struct {
	// Binary is the path of a static Linux kvroute binary (CGO_ENABLED=0).
	Binary string
	// OS and Arch are the binary's platform (default linux and amd64).
	OS, Arch string
	// Version and Revision go into the labels (default "unknown").
	Version, Revision string
	// Source is the repository URL for the source label.
	Source string
	// Created is the build time recorded in the config and on the files (zero: the Unix epoch,
	// so that the same inputs give the same digest).
	Created time.Time
}

// Labels returns the OCI annotations the image's config carries.
func (o Options) Labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "kvroute",
		"org.opencontainers.image.description": "Prefix-aware router for LLM inference fleets",
		"org.opencontainers.image.version":     cmp.Or(o.Version, "unknown"),
		"org.opencontainers.image.revision":    cmp.Or(o.Revision, "unknown"),
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     o.Created.UTC().Format(time.RFC3339),
	}
}

// Build returns the image: OCI media types, one layer with the directories down to the binary
// (root-owned, 0755) and the binary (root-owned, 0755: the unprivileged user may run it but
// not change it), the entrypoint, the user, and the labels.
func Build(o Options) (v1.Image, error) {
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if len(bin) < 4 || !bytes.Equal(bin[:4], []byte("\x7fELF")) {
		return nil, fmt.Errorf("image: %s is not a Linux (ELF) binary: build it with GOOS=linux CGO_ENABLED=0", o.Binary)
	}
	created := o.Created.UTC()
	if created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	layerTar, err := layerTar(bin, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "kvroute tools/image: " + BinaryPath,
		Comment: "the static kvroute binary",
	}})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = cmp.Or(o.OS, "linux")
	cf.Architecture = cmp.Or(o.Arch, "amd64")
	cf.Created = v1.Time{Time: created}
	cf.Author = "kvroute"
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: []string{BinaryPath},
		Cmd:        []string{"serve", "--config", "/etc/kvroute/kvroute.yaml"},
		WorkingDir: "/",
		// PATH lets `kubectl exec POD -- kvroute version` find the binary without a shell.
		Env:          []string{"PATH=/usr/local/bin"},
		Labels:       o.Labels(),
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "9090/tcp": {}},
		StopSignal:   "SIGTERM",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	return img, nil
}

// layerTar is the layer's file system: usr/, usr/local/, usr/local/bin/ and the binary.
func layerTar(bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, fmt.Errorf("image: layer: %w", err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: BinaryPath[1:], Mode: 0o755, Size: int64(len(bin)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	return buf.Bytes(), nil
}
