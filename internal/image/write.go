package image

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteLayout writes img as an OCI image layout in dir (replaced if it exists), its manifest
// annotated with each tag (org.opencontainers.image.ref.name), for skopeo, crane, podman or
// `oras` to push.
func WriteLayout(dir string, img v1.Image, tags []string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("image layout: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image layout: %w", err)
	}
	if len(tags) == 0 {
		tags = []string{""}
	}
	for _, t := range tags {
		var opts []layout.Option
		if t != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": t}))
		}
		if err := p.AppendImage(img, opts...); err != nil {
			return fmt.Errorf("image layout: %w", err)
		}
	}
	return nil
}

// WriteTarball writes img with its tags (like kvroute/kvroute:v0.4.0) as a tarball that
// `docker load` and `podman load` read.
func WriteTarball(path string, img v1.Image, tags []string) error {
	refs := map[name.Reference]v1.Image{}
	for _, t := range tags {
		tag, err := name.NewTag(t)
		if err != nil {
			return fmt.Errorf("image tarball: tag %q: %w", t, err)
		}
		refs[tag] = img
	}
	if len(refs) == 0 {
		return fmt.Errorf("image tarball: give at least one tag")
	}
	if err := tarball.MultiRefWriteToFile(path, refs); err != nil {
		return fmt.Errorf("image tarball: %w", err)
	}
	return nil
}
