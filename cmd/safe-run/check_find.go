package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// skippedDirs are directories check never descends into: version control,
// and trees of other projects' files (dependencies, vendored code).
var skippedDirs = []string{".git", ".hg", ".svn", "node_modules", "vendor", "third_party"}

// isDocument says whether name is a Markdown file by its extension.
func isDocument(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".md", ".markdown":
		return true
	}
	return false
}

// globList collects repeatable --include/--exclude patterns.
type globList []string

func (g *globList) String() string { return strings.Join(*g, ",") }
func (g *globList) Set(s string) error {
	if _, err := path.Match(s, ""); err != nil {
		return fmt.Errorf("bad pattern %q: %v", s, err)
	}
	*g = append(*g, s)
	return nil
}

// matchGlob says whether rel (slash-separated, relative to the root it was
// found under) matches pattern: the whole path, or, for a pattern without a
// slash, its base name; "**/" at the start of a pattern matches any number
// of directories.
func matchGlob(pattern, rel string) bool {
	if ok, _ := path.Match(pattern, rel); ok {
		return true
	}
	if !strings.Contains(pattern, "/") {
		ok, _ := path.Match(pattern, path.Base(rel))
		return ok
	}
	if rest, ok := strings.CutPrefix(pattern, "**/"); ok {
		for p := rel; ; {
			if matchGlob(rest, p) {
				return true
			}
			_, after, found := strings.Cut(p, "/")
			if !found {
				return false
			}
			p = after
		}
	}
	// A pattern naming a directory matches what is below it.
	for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
		if ok, _ := path.Match(pattern, dir); ok {
			return true
		}
	}
	return false
}

// selected says whether a document found at rel passes the filters: some
// include matches (when there are any) and no exclude does.
func selected(rel string, include, exclude []string) bool {
	if len(include) > 0 && !slices.ContainsFunc(include, func(p string) bool { return matchGlob(p, rel) }) {
		return false
	}
	return !slices.ContainsFunc(exclude, func(p string) bool { return matchGlob(p, rel) })
}

// findDocuments lists the documents that paths name: files as given
// (whatever their extension), directories searched recursively for
// Markdown files, skipping skippedDirs. Each is listed once, in the order
// of paths and, within a directory, in lexical order. Links to
// directories are not followed.
func findDocuments(paths []string, include, exclude []string) ([]string, error) {
	var docs []string
	seen := map[string]bool{}
	add := func(p string) {
		if key := filepath.Clean(p); !seen[key] {
			seen[key] = true
			docs = append(docs, p)
		}
	}
	for _, root := range paths {
		fi, err := os.Stat(root)
		if err != nil {
			return nil, usageError("%v", err)
		}
		if !fi.IsDir() {
			if !fi.Mode().IsRegular() {
				return nil, usageError("%s is not a regular file or a directory", root)
			}
			if selected(filepath.ToSlash(filepath.Base(root)), include, exclude) {
				add(root)
			}
			continue
		}
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p != root && slices.Contains(skippedDirs, d.Name()) {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() || !isDocument(d.Name()) {
				return nil
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			if selected(filepath.ToSlash(rel), include, exclude) {
				add(p)
			}
			return nil
		})
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				return nil, usageError("%v", err)
			}
			return nil, usageError("search %s: %v", root, err)
		}
	}
	return docs, nil
}
