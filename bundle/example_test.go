package bundle_test

import (
	"fmt"

	"github.com/safe-run/safe-run/bundle"
)

// Every image must hold the paths the sandbox mounts over, since its root
// is read-only: directories, and the agent's file.
func ExampleMountpoints() {
	dirs, files := bundle.Mountpoints()
	fmt.Println("dirs:", dirs)
	fmt.Println("files:", files)
	// Output:
	// dirs: [/proc /dev /dev/pts /dev/shm /dev/mqueue /dev/net /sys /workspace /tmp]
	// files: [/.safe-run/agent]
}
