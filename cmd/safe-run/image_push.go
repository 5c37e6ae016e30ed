package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/sandbox"
)

// imagePush turns a cached image and the agent into an OCI image whose
// container can run the agent (the Kubernetes backend's sandbox Pods), and
// pushes it.
func imagePush(ctx context.Context, f imageFlags, operands []string) int {
	if len(operands) != 2 {
		return fail(usageError("image push takes the cached image's NAME and the REF to push to, e.g. image push default registry.example:5000/safe-run/default:1"))
	}
	image, ref := operands[0], operands[1]
	if _, err := rootfs.PushReference(ref); err != nil {
		return fail(usageError("%v", err))
	}
	agent := f.agent
	if agent == "" {
		if agent = besideExecutable("safe-run-agent"); agent == "" {
			return fail(usageError("no safe-run-agent next to safe-run; build it (make build) or give its path with --agent PATH"))
		}
	}
	if fi, err := os.Stat(agent); err != nil || !fi.Mode().IsRegular() {
		return fail(usageError("the agent %s is not a file; build it (make build) or give its path with --agent PATH", agent))
	}
	start := time.Now()
	build := newProgress("layering " + image)
	img, done, err := f.store().OCIImage(ctx, image, rootfs.OCIOptions{
		Files:      []rootfs.AddedFile{{Path: bundle.AgentPath, Source: agent, Mode: 0o555}},
		Entrypoint: []string{bundle.AgentPath, "--wait"},
		User:       "65534:65534",
		Progress:   build.update,
	})
	build.done()
	defer done()
	if err != nil {
		return fail(err)
	}
	layered := time.Since(start)
	size, err := imageSize(img)
	if err != nil {
		return fail(err)
	}
	up := newProgress("pushing " + ref)
	digest, err := rootfs.Push(ctx, img, ref, up.update)
	up.done()
	if err != nil {
		return fail(err)
	}
	took := time.Since(start)
	if f.asJSON {
		return printJSON(map[string]any{"image": image, "ref": ref, "digest": digest.String(),
			"pinned": refContext(ref) + "@" + digest.String(), "compressed_bytes": size,
			"layer_seconds": layered.Seconds(), "seconds": took.Seconds()})
	}
	fmt.Fprintf(os.Stderr, "pushed %q as %s (%s compressed) in %.1fs\n", image, ref, sandbox.FormatBytes(size), took.Seconds())
	fmt.Println(refContext(ref) + "@" + digest.String())
	return 0
}

// imageSize is the bytes of img's compressed layers and configuration.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	n := m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}

// refContext is ref without its tag: the repository a digest is pinned in.
func refContext(ref string) string {
	r, err := name.ParseReference(ref)
	if err != nil {
		return ref
	}
	return r.Context().Name()
}
