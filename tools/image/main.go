// Command image builds kvroute's container image from a static binary, without a container
// engine: an OCI image layout directory and/or a tarball for `docker load`. make image runs it:
//
//	go run ./tools/image --binary bin/linux-amd64/kvroute --arch amd64 --version v0.4.0 \
//	  --revision $(git rev-parse HEAD) --tag kvroute/kvroute:v0.4.0 --layout bin/image --tar bin/kvroute-image.tar
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/image"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o image.Options
	fs.StringVar(&o.Binary, "binary", "", "static Linux kvroute `binary` (required)")
	fs.StringVar(&o.OS, "os", "linux", "the binary's OS")
	fs.StringVar(&o.Arch, "arch", "amd64", "the binary's architecture (GOARCH)")
	fs.StringVar(&o.Version, "version", "", "version label (default unknown)")
	fs.StringVar(&o.Revision, "revision", "", "VCS revision label (default unknown)")
	fs.StringVar(&o.Source, "source", "https://github.com/kvroute/kvroute", "source repository label")
	tags := fs.String("tag", "", "comma-separated image `references`, like kvroute/kvroute:v0.4.0,kvroute/kvroute:sha-4f1487b")
	layoutDir := fs.String("layout", "", "write an OCI image layout to this `directory`")
	tarPath := fs.String("tar", "", "write a docker-load tarball to this `file` (needs --tag)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.Binary == "" || (*layoutDir == "" && *tarPath == "") || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "image: give --binary and --layout or --tar (and no other arguments)")
		return 2
	}
	// SOURCE_DATE_EPOCH, the reproducible-builds convention, sets the recorded time.
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "image: SOURCE_DATE_EPOCH=%q: want seconds since 1970\n", s)
			return 2
		}
		o.Created = time.Unix(sec, 0)
	}
	var refs []string
	if *tags != "" {
		refs = strings.Split(*tags, ",")
	}
	img, err := image.Build(o)
	if err == nil && *layoutDir != "" {
		err = image.WriteLayout(*layoutDir, img, refs)
	}
	if err == nil && *tarPath != "" {
		err = image.WriteTarball(*tarPath, img, refs)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	d, err := img.Digest()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "image %s %s/%s version %s: %s\n", d, o.OS, o.Arch, o.Labels()["org.opencontainers.image.version"], strings.Join(refs, " "))
	return 0
}
