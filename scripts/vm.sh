# vm.sh — the host half of the VM tests (scripts/test-cgroup-v2.sh and
# scripts/test-service.sh), sourced by both: QEMU, a Debian kernel with an
# initramfs of the modules the guest needs, and one boot whose serial console
# is shown as it goes. QEMU emulates the CPU (no KVM needed); the guest sees
# this host's root read-only over 9p, so there is no VM image to build.
#
# The caller sets VM_NAME (its name in messages) and GO, and runs as root.
# The guest half sources it too, for vm_cgroup_limits.

# vm_need_qemu installs qemu-system-x86 if it is missing.
vm_need_qemu() {
	if ! command -v qemu-system-x86_64 >/dev/null; then
		echo "[deps] apt-get install qemu-system-x86" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
	fi
}

# vm_kernel WORK CACHE [MODULE...] unpacks a Debian kernel into WORK and packs
# WORK/initrd.gz with the modules for 9p over virtio-pci and each MODULE (a
# path below the kernel's modules' kernel/, such as fs/overlayfs/overlay.ko);
# it sets VM_KERNEL. SAFE_RUN_VM_KERNEL_DEB names the .deb of a
# linux-image-*-amd64; otherwise apt-get downloads the one linux-image-amd64
# depends on, once, into CACHE/vm-kernel/, so that later runs download
# nothing.
vm_kernel() {
	local work=$1 cache=$2 deb=${SAFE_RUN_VM_KERNEL_DEB:-} pkg m
	shift 2
	if [[ -z $deb ]]; then
		pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
		[[ -n $pkg ]] || {
			echo "$VM_NAME: no Debian kernel package found; name one with SAFE_RUN_VM_KERNEL_DEB" >&2
			return 1
		}
		local debs=$cache/vm-kernel
		if ! compgen -G "$debs/${pkg}_*.deb" >/dev/null; then
			mkdir -p "$debs"
			(cd "$work" && apt-get download -q "$pkg" >/dev/null 2>&1) &&
				mv "$work/${pkg}"_*.deb "$debs/"
		fi
		deb=$(echo "$debs/${pkg}"_*.deb)
	fi
	local patterns=('*/kernel/drivers/virtio/virtio*.ko' '*/kernel/fs/netfs/*.ko' '*/kernel/fs/fscache/*.ko'
		'*/kernel/net/9p/*.ko' '*/kernel/fs/9p/*.ko')
	local names=(-name virtio.ko -o -name virtio_ring.ko -o -name 'virtio_pci*.ko' -o -name netfs.ko
		-o -name fscache.ko -o -name 9pnet.ko -o -name 9pnet_virtio.ko -o -name 9p.ko)
	for m in "$@"; do
		patterns+=("*/kernel/$m")
		names+=(-o -name "$(basename "$m")")
	done
	mkdir "$work/k"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work/k" --wildcards './boot/vmlinuz-*' "${patterns[@]}"
	VM_KERNEL=$(echo "$work"/k/boot/vmlinuz-*)
	"$GO" build -o "$work/vminit" ./scripts/vminit
	local modules
	mapfile -t modules < <(find "$work/k" \( "${names[@]}" \))
	"$work/vminit" -pack "$work/initrd.gz" "${modules[@]}"
}

# vm_boot WORK TIMEOUT CMDLINE boots VM_KERNEL with WORK/initrd.gz and the
# kernel command line CMDLINE (two CPUs, 4 GiB, no network card), at most
# TIMEOUT (timeout(1)'s syntax), showing the console without kernel messages
# while it runs; the whole console is WORK/console.log. It sets VM_STATUS to
# QEMU's exit status (124: timed out). Signals are handled at once: the VM
# runs in the background, and vm_stop ends it.
vm_boot() {
	local work=$1 timeout=$2 cmdline=$3
	timeout --kill-after=10s "$timeout" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 4G \
		-nographic -no-reboot -nic none -kernel "$VM_KERNEL" -initrd "$work/initrd.gz" \
		-append "$cmdline" \
		-virtfs "local,path=/,mount_tag=host,security_model=passthrough,readonly=on,multidevs=remap" \
		</dev/null >"$work/console.log" 2>&1 &
	VM_QEMU=$!
	tail -f --pid="$VM_QEMU" "$work/console.log" |
		grep --line-buffered -av -e '^\[ *[0-9]' -e 'Job .* running' | tr -d '\033' &
	VM_STATUS=0
	wait "$VM_QEMU" || VM_STATUS=$?
	VM_QEMU=""
	wait
}

# vm_stop ends a VM still running (for an EXIT trap) and waits for it and
# its console's display.
vm_stop() {
	if [[ -n ${VM_QEMU:-} ]]; then
		kill "$VM_QEMU" 2>/dev/null || true
	fi
	wait
}

# vm_cgroup_limits DIR prints the limits of the cgroup v2 DIR on one line,
# "memory.max=M pids.max=P cpu.max=QUOTA/PERIOD", or fails if the cgroup went
# away while they were read.
vm_cgroup_limits() {
	local m p c
	m=$(cat "$1/memory.max" 2>/dev/null) && p=$(cat "$1/pids.max" 2>/dev/null) &&
		c=$(cat "$1/cpu.max" 2>/dev/null) || return
	echo "memory.max=$m pids.max=$p cpu.max=${c/ //}"
}
