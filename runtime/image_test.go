package runtime

import (
	"errors"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

// TestImageForJob checks which image a job runs in: the one it names, else
// its language's, else the default one.
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
	policy := sandbox.Policy{Languages: sandbox.MergeLanguages(sandbox.DefaultLanguages, []sandbox.Language{
		{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}, Image: "ruby:3.3"},
		{Name: "gone", Filename: "main.x", Command: []string{"x"}, Image: "missing:1"},
	})}
	rt := &Runtime{cfg: Config{Rootfs: "/images/default", Images: resolve, Policy: policy}}
	tests := []struct {
		job     sandbox.Job
		want    string
		wantErr string
	}{
		{sandbox.Job{Language: "python"}, "/images/default", ""},
		{sandbox.Job{Language: "python", Image: "python:3.12-slim"}, "/images/python", ""},
		{sandbox.Job{Language: "ruby"}, "/images/ruby", ""},
		{sandbox.Job{Language: "ruby", Image: "python:3.12-slim"}, "/images/python", ""},
		{sandbox.Job{Language: "gone"}, "", "image missing:1: not found"},
	}
	for _, tt := range tests {
		img, err := rt.image(tt.job)
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
	if img, _ := rt.image(sandbox.Job{Language: "python", Image: "python:3.12-slim"}); img.WorkingDir != "/srv" || len(img.Env) != 1 {
		t.Errorf("the image's settings were lost: %+v", img)
	}
	// Without a resolver only the default image exists.
	rt.cfg.Images = nil
	if img, err := rt.image(sandbox.Job{Language: "ruby"}); err != nil || img.Rootfs != "/images/default" {
		t.Errorf("image without a resolver = %+v, %v", img, err)
	}
}
