// Package hostile writes the hostile image archives the tests of rootfs
// and of the safe-run binary import: archives whose parts contradict each
// other or reach outside themselves, which no well-behaved tool writes.
package hostile

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Entry is one member of an archive: a regular file with Body, or a
// symbolic link to Link.
type Entry struct {
	Name string
	Body []byte
	Link string
}

// Tar returns an uncompressed tar archive of entries, with the
// directories they need.
func Tar(entries []Entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	seen := map[string]bool{}
	for _, e := range entries {
		for i := range len(e.Name) {
			if dir := e.Name[:i]; e.Name[i] == '/' && !seen[dir] {
				seen[dir] = true
				if err := tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
					return nil, err
				}
			}
		}
		hdr := &tar.Header{Name: e.Name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.Body)), ModTime: mtime}
		if e.Link != "" {
			hdr = &tar.Header{Name: e.Name, Typeflag: tar.TypeSymlink, Linkname: e.Link, Mode: 0o777, ModTime: mtime}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.Body); err != nil {
			return nil, err
		}
	}
	err := tw.Close()
	return buf.Bytes(), err
}

// WriteTar writes Tar(entries) to file.
func WriteTar(file string, entries []Entry) error {
	data, err := Tar(entries)
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o644)
}

// Digest is the "sha256:…" digest of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func hexOf(b []byte) string { return Digest(b)[len("sha256:"):] }

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Manifest is an OCI image manifest of config and uncompressed layers,
// whatever the configuration says of them.
func Manifest(config []byte, layers [][]byte) []byte {
	m := struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Config        descriptor   `json:"config"`
		Layers        []descriptor `json:"layers"`
	}{2, "application/vnd.oci.image.manifest.v1+json",
		descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: Digest(config), Size: len(config)}, nil}
	for _, l := range layers {
		m.Layers = append(m.Layers, descriptor{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: Digest(l), Size: len(l)})
	}
	data, _ := json.Marshal(m)
	return data
}

// Index is an OCI layout's index.json naming one image manifest, of digest
// and size, under ref (none if empty).
func Index(digest string, size int, ref string) []byte {
	d := descriptor{MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: digest, Size: size}
	if ref != "" {
		d.Annotations = map[string]string{"org.opencontainers.image.ref.name": ref}
	}
	data, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []descriptor{d}})
	return data
}

// OCI is an OCI layout archive of one image — config and uncompressed
// layers, consistent or not — named ref, and the manifest's digest.
func OCI(config []byte, layers [][]byte, ref string) ([]Entry, string) {
	manifest := Manifest(config, layers)
	entries := []Entry{
		{Name: "oci-layout", Body: []byte(`{"imageLayoutVersion": "1.0.0"}`)},
		{Name: "index.json", Body: Index(Digest(manifest), len(manifest), ref)},
		{Name: "blobs/sha256/" + hexOf(manifest), Body: manifest},
		{Name: "blobs/sha256/" + hexOf(config), Body: config},
	}
	for _, l := range layers {
		entries = append(entries, Entry{Name: "blobs/sha256/" + hexOf(l), Body: l})
	}
	return entries, Digest(manifest)
}

// Docker is a docker save archive of one image — config and uncompressed
// layers, consistent or not — tagged repoTag (none if empty).
func Docker(config []byte, layers [][]byte, repoTag string) []Entry {
	m := map[string]any{"Config": hexOf(config) + ".json"}
	if repoTag != "" {
		m["RepoTags"] = []string{repoTag}
	}
	entries := []Entry{{Name: hexOf(config) + ".json", Body: config}}
	var names []string
	for i, l := range layers {
		name := fmt.Sprintf("%064d/layer.tar", i)
		names = append(names, name)
		entries = append(entries, Entry{Name: name, Body: l})
	}
	m["Layers"] = names
	data, _ := json.Marshal([]any{m})
	return append([]Entry{{Name: "manifest.json", Body: data}}, entries...)
}
