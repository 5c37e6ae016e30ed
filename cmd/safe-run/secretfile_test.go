package main

import (
	"io/fs"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"
)

// statInfo is a file's os.FileInfo as Stat gives it, with the owner, group
// and mode a test needs (no chown, so it runs as any user).
type statInfo struct {
	mode     fs.FileMode
	uid, gid uint32
}

func (s statInfo) Name() string       { return "secret" }
func (s statInfo) Size() int64        { return 40 }
func (s statInfo) Mode() fs.FileMode  { return s.mode }
func (s statInfo) ModTime() time.Time { return time.Time{} }
func (s statInfo) IsDir() bool        { return false }
func (s statInfo) Sys() any           { return &syscall.Stat_t{Uid: s.uid, Gid: s.gid} }

func TestPrivateSecret(t *testing.T) {
	ours := uint32(os.Getegid())
	groups, _ := os.Getgroups()
	notOurs := uint32(54321)
	for slices.Contains(groups, int(notOurs)) || notOurs == ours {
		notOurs++
	}
	me := uint32(os.Geteuid())
	for _, tc := range []struct {
		name string
		info statInfo
		want bool
	}{
		{"the owner's alone", statInfo{0o600, me, notOurs}, true},
		{"read-only, the owner's alone", statInfo{0o400, me, notOurs}, true},
		{"root's, read by our group (a Kubernetes Secret with fsGroup)", statInfo{0o440, 0, ours}, true},
		{"root's, read by our group, owner may write", statInfo{0o640, 0, ours}, true},
		{"root's, read by a group we are not in", statInfo{0o440, 0, notOurs}, false},
		{"root's, our group may write", statInfo{0o460, 0, ours}, false},
		{"root's, anyone may read", statInfo{0o444, 0, ours}, false},
		{"root's, others may read, no group", statInfo{0o404, 0, ours}, false},
		{"another user's, read by our group", statInfo{0o440, 12345, ours}, false},
		{"ours, read by our group", statInfo{0o640, 12345, ours}, false},
		{"anyone may read", statInfo{0o644, me, ours}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := privateSecret(tc.info); got != tc.want {
				t.Errorf("privateSecret(mode %04o, uid %d, gid %d) = %v, want %v", tc.info.mode, tc.info.uid, tc.info.gid, got, tc.want)
			}
		})
	}
}
