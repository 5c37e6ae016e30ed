package rootfs_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/safe-run/safe-run/rootfs"
)

func ExampleExtract() {
	// An archive with a setuid program, a device node and a link.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		hdr  tar.Header
		body string
	}{
		{tar.Header{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644}, "hello\n"},
		{tar.Header{Name: "usr/bin/su", Typeflag: tar.TypeReg, Mode: 0o4755}, "#!/bin/false\n"},
		{tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, ""},
		{tar.Header{Name: "bin", Typeflag: tar.TypeSymlink, Linkname: "usr/bin"}, ""},
	} {
		f.hdr.Size = int64(len(f.body))
		if err := tw.WriteHeader(&f.hdr); err != nil {
			log.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.body)); err != nil {
			log.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		log.Fatal(err)
	}

	dst, err := os.MkdirTemp("", "rootfs-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dst)

	st, err := rootfs.Extract(&buf, dst, rootfs.DefaultExtractLimits)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d entries, %d bytes, %d skipped, %d stripped\n", st.Entries, st.Bytes, st.Skipped, st.Stripped)

	motd, err := os.ReadFile(filepath.Join(dst, "etc/motd"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("etc/motd: %q\n", motd)
	fi, err := os.Stat(filepath.Join(dst, "bin/su"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("bin/su:", fi.Mode())
	if _, err := os.Lstat(filepath.Join(dst, "dev/null")); os.IsNotExist(err) {
		fmt.Println("dev/null: not created")
	}
	// Output:
	// 3 entries, 19 bytes, 1 skipped, 1 stripped
	// etc/motd: "hello\n"
	// bin/su: -rwxr-xr-x
	// dev/null: not created
}
