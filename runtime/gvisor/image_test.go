package gvisor

import (
	"errors"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

// TestImageForJob checks which image a sandbox runs in: the one its job
// names (the engine fills in the language's), else the default one.
func TestImageForJob(t *testing.T) {
	images := map[string]Image{
		"python:3.12-slim": {Rootfs: "/images/python", Env: []string{"PATH=/usr/local/bin:/usr/bin"}, WorkingDir: "/srv"},
		"ruby:3.3":         {Rootfs: "/images/ruby"},
	}
	resolve := func(ref string) (Image, error) {
		img, ok := images[ref]
		if !ok {
			return Image{}, errors.New("not found")
		}
		return img, nil
	}
	g := &Backend{cfg: Config{Rootfs: "/images/default", Images: resolve}}
	tests := []struct {
		job     sandbox.Job
		want    string
		wantErr string
	}{
		{sandbox.Job{Language: "python"}, "/images/default", ""},
		{sandbox.Job{Language: "python", Image: "python:3.12-slim"}, "/images/python", ""},
		{sandbox.Job{Language: "ruby", Image: "ruby:3.3"}, "/images/ruby", ""},
		{sandbox.Job{Language: "gone", Image: "missing:1"}, "", "image missing:1: not found"},
	}
	for _, tt := range tests {
		img, err := g.image(tt.job)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("image(%+v) = %v, want an error containing %q", tt.job, err, tt.wantErr)
			}
			continue
		}
		if err != nil || img.Rootfs != tt.want {
			t.Errorf("image(%+v) = %+v, %v; want root %s", tt.job, img, err, tt.want)
		}
	}
	if img, _ := g.image(sandbox.Job{Language: "python", Image: "python:3.12-slim"}); img.WorkingDir != "/srv" || len(img.Env) != 1 {
		t.Errorf("the image's settings were lost: %+v", img)
	}
	// Without a resolver only the default image exists.
	g.cfg.Images = nil
	if img, err := g.image(sandbox.Job{Language: "ruby", Image: "ruby:3.3"}); err != nil || img.Rootfs != "/images/default" {
		t.Errorf("image without a resolver = %+v, %v", img, err)
	}
}
