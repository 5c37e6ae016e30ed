// Command vminit is the first process of the throwaway virtual machine that
// scripts/test-cgroup-v2.sh boots to try safe-run in a delegated cgroup v2,
// which a hybrid host cannot offer without rebinding its own controllers.
//
// Run on the host with -pack, it writes a gzipped initramfs holding itself as
// /init and the given kernel modules. Run as process 1 in the VM, it loads
// those modules (virtio and 9p), mounts the host's root that QEMU exports
// read-only over 9p as the root, and executes its arguments there: the
// kernel passes what follows "--" on its command line.
package main

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if os.Getpid() == 1 {
		boot(os.Args[1:])
		return
	}
	out := flag.String("pack", "", "write the initramfs (gzipped newc cpio) to this file")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: vminit -pack INITRAMFS MODULE.ko...")
		os.Exit(2)
	}
	if err := pack(*out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "vminit:", err)
		os.Exit(1)
	}
}

// moduleDir is where the initramfs keeps the kernel modules.
const moduleDir = "/modules"

// pack writes an initramfs holding this executable as /init and modules
// below moduleDir.
func pack(out string, modules []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	var raw bytes.Buffer
	w := cpioWriter{w: &raw}
	if err := w.file("init", self); err != nil {
		return err
	}
	w.dir(moduleDir[1:])
	for _, m := range modules {
		if err := w.file(moduleDir[1:]+"/"+filepath.Base(m), m); err != nil {
			return err
		}
	}
	w.dir("host")
	w.dir("dev")
	w.trailer()
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	zw := gzip.NewWriter(f)
	_, err = io.Copy(zw, &raw)
	if err == nil {
		err = zw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write initramfs %s: %w", out, err)
	}
	return nil
}

// cpioWriter writes the "newc" cpio format the kernel unpacks an initramfs
// from.
type cpioWriter struct {
	w   *bytes.Buffer
	ino int
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte) {
	c.ino++
	fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	c.w.WriteString(name + "\x00")
	c.pad()
	c.w.Write(data)
	c.pad()
}

func (c *cpioWriter) pad() {
	for c.w.Len()%4 != 0 {
		c.w.WriteByte(0)
	}
}

func (c *cpioWriter) dir(name string) { c.entry(name, syscall.S_IFDIR|0o755, nil) }

func (c *cpioWriter) file(name, src string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("pack %s: %w", src, err)
	}
	c.entry(name, syscall.S_IFREG|0o755, data)
	return nil
}

func (c *cpioWriter) trailer() { c.entry("TRAILER!!!", 0, nil) }

// boot is process 1: it never returns; on failure it powers the VM off.
func boot(argv []string) {
	if len(argv) == 0 {
		halt(fmt.Errorf("no command: put it after -- on the kernel command line"))
	}
	if err := loadModules(); err != nil {
		halt(err)
	}
	steps := []struct {
		what string
		err  func() error
	}{
		{"mount the host's root", func() error {
			return unix.Mount("host", "/host", "9p", unix.MS_RDONLY, "trans=virtio,version=9p2000.L,msize=524288,cache=loose")
		}},
		{"enter it", func() error { return os.Chdir("/host") }},
		{"make it the root", func() error { return unix.Mount(".", "/", "", unix.MS_MOVE, "") }},
		{"chroot", func() error { return unix.Chroot(".") }},
		{"chdir", func() error { return os.Chdir("/") }},
	}
	for _, s := range steps {
		if err := s.err(); err != nil {
			halt(fmt.Errorf("%s: %w", s.what, err))
		}
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	halt(fmt.Errorf("run %v: %w", argv, unix.Exec(argv[0], argv, env)))
}

// loadModules loads every module of moduleDir, retrying those whose
// dependencies were not loaded yet until a pass makes no progress.
func loadModules() error {
	pending, _ := filepath.Glob(filepath.Join(moduleDir, "*.ko"))
	for len(pending) > 0 {
		var left []string
		var last error
		for _, m := range pending {
			if err := loadModule(m); err != nil {
				left = append(left, m)
				last = err
			}
		}
		if len(left) == len(pending) {
			return fmt.Errorf("load kernel modules %v: %w", left, last)
		}
		pending = left
	}
	return nil
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && err != unix.EEXIST {
		return err
	}
	return nil
}

func halt(err error) {
	fmt.Println("vminit:", err)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
