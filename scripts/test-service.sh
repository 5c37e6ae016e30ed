#!/usr/bin/env bash
# test-service.sh — safe-run as the systemd service of `make install-service`,
# checked through the real unit in a throwaway VM with systemd as process 1.
#
#   scripts/test-service.sh            (as root, after `make build runsc rootfs`)
#   scripts/test-service.sh --verify   systemd-analyze verify and the exposure score only, on this host
#
# QEMU (software emulation, no KVM needed) boots Debian's kernel with this
# host's root exported read-only over 9p, as scripts/test-cgroup-v2.sh does;
# there is no VM image to build: process 1 first lays a RAM overlay over that
# root (so the install can write /etc, /usr/local, /var), trims the host's own
# units away and then executes systemd, which boots cgroup v2 alone into
# service-test.target. Its one service, as root: scripts/install-service.sh
# install (the steps of `make install-service`), then the checks of issue 19
# through the real unit, then uninstall; then it powers the VM off.
# The VM's host half is scripts/vm.sh, shared with test-cgroup-v2. Bounded
# by TEST_SERVICE_TIMEOUT (default 40m).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PASS_LINE="test-service: all checks passed"
UNIT_CG=/sys/fs/cgroup/system.slice/safe-run.service

# verify_unit UNIT-FILE prints systemd-analyze verify's findings and the
# exposure score of the unit file, offline.
verify_unit() {
	local rc=0
	systemd-analyze verify "$1" || rc=$?
	systemd-analyze security --offline=true --no-pager "$1" | tail -n 1
	return "$rc"
}

# ---- process 1 of the VM: the overlay root, then systemd ----

boot() {
	local repo=$1 probe=${2:-}
	mount -n -t proc proc /proc
	mount -n -t tmpfs -o mode=755 ram /mnt
	mkdir /mnt/upper /mnt/work /mnt/root
	mount -n -t overlay overlay -o lowerdir=/,upperdir=/mnt/upper,workdir=/mnt/work /mnt/root
	local r=/mnt/root
	# None of the host's units: only what the test target pulls in.
	rm -rf "$r"/etc/systemd/system/*.wants "$r"/etc/systemd/system/*.target.wants
	: >"$r/etc/fstab"
	# tmpfiles would walk the host's /var and /tmp over 9p for minutes.
	local u
	for u in systemd-tmpfiles-setup.service systemd-tmpfiles-clean.timer systemd-tmpfiles-setup-dev.service \
		systemd-udev-trigger.service systemd-random-seed.service; do
		ln -sf /dev/null "$r/etc/systemd/system/$u"
	done
	rm -f "$r/etc/machine-id"
	: >"$r/etc/machine-id"
	cat >"$r/etc/systemd/system/service-test.target" <<UNIT
[Unit]
Description=test-service
Requires=service-test.service
After=service-test.service
UNIT
	cat >"$r/etc/systemd/system/service-test.service" <<UNIT
[Unit]
Description=test-service checks
After=basic.target
[Service]
Type=oneshot
Environment=TEST_SERVICE_PROBE=$probe
ExecStart=/bin/bash $repo/scripts/test-service.sh --in-vm
ExecStopPost=/bin/systemctl --no-block poweroff
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
TTYReset=no
TTYVHangup=no
TimeoutStartSec=infinity
UNIT
	umount -n /proc
	cd "$r"
	mount -n --move . /
	exec chroot . /lib/systemd/systemd --unit=service-test.target
}

# ---- the checks, as root, in a service of the VM's systemd ----

# probe_off: with TEST_SERVICE_PROBE=1, each hardening option the unit
# leaves off is tried alone on a Python run as the service user (5 runs, 2
# doctors, some 5 minutes under emulation, so not in CI).
probe_off() {
	local out off
	echo "== the hardening options the unit leaves off: each breaks a run (a transient service as safe-run with it)"
	# probe CMD SETTING...: safe-run CMD (run: a Python run; doctor) as the
	# service user, delegated, with SETTING, as a oneshot service
	# (systemd-run --wait would need D-Bus, which the VM does not start).
	probe() {
		local s cmd=$1 unit=safe-run-probe-$RANDOM.service
		shift
		case $cmd in
		run) cmd="run --state-dir /run/safe-run-probe --lang python -c 'print(6*7)'" ;;
		doctor) cmd="doctor --state-dir /run/safe-run-probe" ;;
		esac
		{
			printf '%s\n' "[Service]" Type=oneshot User=safe-run Delegate=yes RuntimeDirectory=safe-run-probe \
				RuntimeDirectoryMode=0700 CacheDirectory=safe-run-service StateDirectory=safe-run \
				"Environment=HOME=/var/lib/safe-run XDG_CACHE_HOME=/var/cache/safe-run-service" \
				StandardOutput=append:/run/$unit.out StandardError=append:/run/$unit.out
			for s in "$@"; do printf '%s\n' "$s"; done
			printf '%s\n' "ExecStart=/usr/local/bin/safe-run $cmd"
		} >/run/systemd/system/$unit
		systemctl daemon-reload
		timeout 10m systemctl start "$unit" 2>/dev/null || true
		cat "/run/$unit.out" 2>/dev/null
		rm -f "/run/systemd/system/$unit" "/run/$unit.out"
		systemctl reset-failed "$unit" 2>/dev/null || true
	}
	out=$(probe run) || true
	grep -qx 42 <<<"$out" || fail "probe: the control run without extra settings failed: $out"
	out=$(probe doctor) || true
	grep -Eq '^PASS +cgroups' <<<"$out" || fail "probe: the control doctor found no delegated cgroup: $out"
	# A run that works may still have lost its cgroup limits: doctor says.
	for off in RestrictNamespaces=yes ProtectControlGroups=yes MemoryDenyWriteExecute=yes SystemCallFilter=@system-service; do
		out=$(probe run "$off") || true
		if ! grep -qx 42 <<<"$out"; then
			echo "$off breaks a run: $(tail -n 1 <<<"$out")"
			continue
		fi
		out=$(probe doctor "$off") || true
		if grep -Eq '^PASS +cgroups' <<<"$out"; then
			fail "probe: a run works with $off, which the unit leaves off as breaking runs or their limits"
		else
			echo "$off breaks the runs' limits: $(grep -E '^[A-Z]+ +cgroups' <<<"$out" | head -n 1)"
		fi
	done
}

# serving_lines counts the server's "serving MCP at" lines in this boot's journal.
serving_lines() {
	journalctl -u safe-run.service -b -q --no-pager 2>/dev/null | grep -c "serving MCP at" || true
}

in_vm() {
	local failed=0 token url ca node_modules
	fail() {
		echo "FAIL: $*"
		failed=1
	}
	echo "== VM: kernel $(uname -r), $(nproc) CPUs, systemd $(systemctl --version | awk 'NR==1{print $2}'), cgroup $(stat -fc %T /sys/fs/cgroup)"
	# The settings the checks measure: each run's limits, and no warm pool,
	# whose sandboxes would take minutes to start under emulation.
	mkdir -p /etc/safe-run
	cat >/etc/safe-run/config.json <<'JSON'
{
  "http": "127.0.0.1:8443",
  "tls-cert": "/etc/safe-run/tls/cert.pem",
  "tls-key": "/etc/safe-run/tls/key.pem",
  "token-file": "/etc/safe-run/token",
  "state-dir": "/run/safe-run",
  "audit-log": "/var/log/safe-run/audit.jsonl",
  "memory": "256MiB",
  "pids": 32,
  "cpus": 0.5,
  "timeout": "10m",
  "pool": "",
  "allow-net": ["probe.test=127.0.0.1:8099"]
}
JSON
	echo "== install (scripts/install-service.sh install: the steps of make install-service)"
	local t0=$SECONDS
	if ! PREFIX=/usr/local scripts/install-service.sh install; then
		fail "install"
		journalctl -u safe-run --no-pager | tail -n 40
		return
	fi
	echo "installed and started in $((SECONDS - t0)) s"
	echo "== systemd-analyze verify and security on the installed unit"
	systemd-analyze verify /etc/systemd/system/safe-run.service || fail "systemd-analyze verify"
	systemd-analyze security --no-pager safe-run.service | tail -n 1

	local pid user
	pid=$(systemctl show -p MainPID --value safe-run.service)
	user=$(ps -o user= -p "$pid" || true)
	echo "main process $pid runs as $user; its cgroup: $(cat "/proc/$pid/cgroup")"
	[[ $user == safe-run ]] || fail "the server runs as '$user', not safe-run"
	grep -q "safe-run.service/supervisor$" "/proc/$pid/cgroup" || fail "the server is not in its delegated cgroup's supervisor leaf"
	echo "delegated: $(stat -c %U $UNIT_CG/cgroup.subtree_control) owns cgroup.subtree_control; controllers: $(cat $UNIT_CG/cgroup.controllers); given to runs: $(cat $UNIT_CG/cgroup.subtree_control)"

	token=$(cat /etc/safe-run/token)
	url=https://127.0.0.1:8443/mcp
	ca=/etc/safe-run/tls/ca.pem
	node_modules=${SAFE_RUN_NPM_CACHE:-/var/cache/safe-run/npm-tools}/node_modules
	mcp() { NODE_PATH=$node_modules NODE_EXTRA_CA_CERTS=$ca timeout 15m node scripts/mcp-run.mjs "$url" "$token" "$@"; }

	echo "== an MCP client (the TypeScript SDK) over HTTPS: print(6*7)"
	local out
	out=$(mcp 'print(6*7)' 2>&1) || true
	echo "$out"
	grep -qx 42 <<<"$out" || fail "print(6*7) over HTTPS did not give 42"
	out=$(NODE_PATH=$node_modules timeout 5m node scripts/mcp-run.mjs "$url" "$token" 'print(1)' 2>&1) || true
	grep -q certificate <<<"$out" || fail "a client not trusting the CA was not refused: $out"
	out=$(NODE_PATH=$node_modules NODE_EXTRA_CA_CERTS=$ca timeout 5m node scripts/mcp-run.mjs "$url" "" 'print(1)' 2>&1) || true
	grep -q unauthorized <<<"$out" || fail "a client without the token was not refused: $out"

	echo "== a run with a network (allow-net in the config) reaches a server on the VM's loopback through its pin, under every hardening option"
	python3 -m http.server 8099 --bind 127.0.0.1 --directory /etc/safe-run/tls >/dev/null 2>&1 &
	local web=$!
	out=$(MCP_RUN_ARGS='{"network": ["probe.test"]}' mcp 'import urllib.request; print("fetched", urllib.request.urlopen("http://probe.test:8099/ca.pem", timeout=60).status)' 2>&1) || true
	echo "$out"
	grep -qx "fetched 200" <<<"$out" || fail "a networked run through the service did not reach its pinned server: $out"
	out=$(mcp 'import socket
try:
    socket.create_connection(("probe.test", 8099), timeout=10)
    print("reached")
except OSError as e:
    print("no network:", type(e).__name__)' 2>&1) || true
	echo "$out"
	grep -q "^no network" <<<"$out" || fail "a run that did not ask for the network reached the server: $out"
	kill "$web" 2>/dev/null || true


	# limits DIR NAME: writes the limits of the cgroup DIR to
	# /tmp/NAME.limits, unless the cgroup went away while they were read.
	limits() {
		local l
		l=$(vm_cgroup_limits "$1") && echo "$1 $l" >"/tmp/$2.limits"
	}
	# measured NAME CODE: runs CODE through MCP while watching its run's
	# cgroup below the unit's; its limits land in /tmp/NAME.limits, read
	# again every 2 s: a new sandbox gets its CPU limit once it has started,
	# before the run's code.
	measured() {
		local name=$1 code=$2 d="" w
		(
			until [[ -n $d || -e /tmp/$name.done ]]; do
				sleep 0.5
				d=$(find $UNIT_CG -mindepth 1 -maxdepth 1 -name 'safe-run-*' 2>/dev/null | head -1)
			done
			[[ -z $d ]] && exit
			limits "$d" "$name" || true
			while [[ -d $d ]]; do
				limits "$d" "$name" || true
				awk -v t="$(date +%s.%N)" '/^usage_usec/{u=$2} /^nr_throttled/{n=$2} END{if (u != "") print t, u, n}' "$d/cpu.stat" 2>/dev/null >>"/tmp/$name.cpu" || true
				sleep 2
			done
		) &
		w=$!
		mcp "$code" >"/tmp/$name.out" 2>&1 || true
		touch "/tmp/$name.done"
		wait "$w"
		cat "/tmp/$name.out"
		echo "run cgroup: $(cat "/tmp/$name.limits" 2>/dev/null || echo 'none appeared')"
	}
	echo "== memory 256MiB (config), the program allocates 1 GiB"
	local before after
	before=$(awk '/^oom_kill /{print $2}' $UNIT_CG/memory.events)
	measured memory 'b = b"x" * (1 << 30); print(len(b))'
	after=$(awk '/^oom_kill /{print $2}' $UNIT_CG/memory.events)
	grep -q "status: oom" /tmp/memory.out || fail "memory: the run's status is not oom"
	((after > before)) || fail "memory: the unit's cgroup counted no OOM kill ($before, $after): the limit was not a cgroup's"
	# memory.max is the run's limit plus the sandbox's own overhead.
	grep -Eq "memory.max=[0-9]+ " /tmp/memory.limits || fail "memory: the run cgroup has no memory.max"
	echo "== pids 32 (config), the program forks until it cannot"
	measured pids '
import os, time
n = 0
try:
    while n < 200:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print("fork failed after", n, "children:", e)
'
	grep -q "fork failed after" /tmp/pids.out || fail "pids: the forks were not stopped"
	grep -q "pids.max=[0-9]" /tmp/pids.limits || fail "pids: the run cgroup has no pids.max"
	echo "== cpus 0.5 (config), the program spins for 30 s"
	measured cpu '
import time
t = time.time()
while time.time() - t < 30:
    pass
print("spun 30 s")
'
	grep -q "spun 30 s" /tmp/cpu.out || fail "cpu: the loop did not finish"
	grep -q "cpu.max=50000/100000" /tmp/cpu.limits || fail "cpu: the run cgroup's cpu.max is not 50000/100000"
	local throttled
	throttled=$(awk 'END{print $3+0}' /tmp/cpu.cpu 2>/dev/null || echo 0)
	echo "cpu: throttled $throttled times"
	((throttled > 0)) || fail "cpu: the run cgroup never throttled the loop"

	echo "== audit log"
	local audit=/var/log/safe-run/audit.jsonl n1 n2
	ls -l "$audit" || fail "no audit log at $audit"
	out=$(/usr/local/bin/safe-run audit verify "$audit" 2>&1) || fail "audit verify: $out"
	echo "$out"
	n1=$(wc -l <"$audit")

	echo "== systemctl restart during a run: the chain goes on, the run is cleaned up"
	MCP_RUN_ARGS='{"timeout_seconds": 600}' mcp 'import time; time.sleep(600)' >/tmp/sleep.out 2>&1 &
	local sleeper=$! run_cg="" i
	for ((i = 0; i < 600; i++)); do
		run_cg=$(find $UNIT_CG -mindepth 1 -maxdepth 1 -name 'safe-run-*' | head -1)
		[[ -z $run_cg ]] || break
		sleep 0.5
	done
	[[ -n $run_cg ]] || fail "restart: the sleeping run's cgroup never appeared"
	local served
	served=$(serving_lines)
	systemctl restart safe-run.service
	wait "$sleeper" || true
	# restart returns once the server is executed, not once it listens.
	for ((i = 0; i < 900; i++)); do
		(($(serving_lines) > served)) && break
		systemctl is-failed -q safe-run.service && break
		sleep 1
	done
	(($(serving_lines) > served)) || fail "restart: no new \"serving MCP at\" line in the journal after $i s"
	echo "serving again $i s after the restart"
	[[ -z $run_cg || ! -d $run_cg ]] || fail "restart: the run's cgroup $run_cg is still there"
	pgrep -af "runsc.*$(basename "${run_cg:-none}")" && fail "restart: the run's runsc processes are still there"
	out=$(mcp 'print(6*7)' 2>&1) || true
	grep -qx 42 <<<"$out" || fail "after restart, print(6*7) did not give 42: $out"
	n2=$(wc -l <"$audit")
	out=$(/usr/local/bin/safe-run audit verify "$audit" 2>&1) || fail "audit verify after restart: $out"
	echo "$out (records: $n1 before the restart, $n2 after)"
	((n2 > n1)) || fail "restart: no records appended after the restart"

	echo "== safe-run doctor --unit (as root: a doctor run inside the unit's settings)"
	/usr/local/bin/safe-run doctor --unit safe-run.service || fail "doctor --unit"
	echo "== safe-run doctor --unit as the service user: the cgroup only, and that the rest needs root"
	out=$(setpriv --reuid=safe-run --regid=safe-run --init-groups /usr/local/bin/safe-run doctor --unit safe-run.service 2>&1) ||
		fail "doctor --unit as safe-run: $out"
	echo "$out"
	grep -q "PASS  cgroups" <<<"$out" || fail "doctor --unit as safe-run did not read the unit's cgroup"
	grep -q "which needs root" <<<"$out" || fail "doctor --unit as safe-run did not say the rest needs root"

	echo "== systemctl stop: no sandbox, cgroup or state directory left"
	systemctl stop safe-run.service
	local left
	left=$(pgrep -u safe-run -a || true)
	[[ -z $left ]] || fail "stop: processes of safe-run left: $left"
	[[ ! -d $UNIT_CG ]] || fail "stop: the unit's cgroup is still there: $(find $UNIT_CG -type d)"
	[[ ! -d /run/safe-run ]] || fail "stop: /run/safe-run is still there: $(ls -la /run/safe-run)"

	if [[ ${TEST_SERVICE_PROBE:-} == 1 ]]; then
		probe_off
	fi

	echo "== uninstall: all but the audit log"
	scripts/install-service.sh uninstall || fail "uninstall"
	for f in /etc/systemd/system/safe-run.service /usr/local/bin/safe-run /usr/local/bin/safe-run-shim /etc/safe-run /var/cache/safe-run-service /var/lib/safe-run; do
		[[ ! -e $f ]] || fail "uninstall left $f"
	done
	[[ -s $audit ]] || fail "uninstall removed the audit log"
	PURGE=1 scripts/install-service.sh uninstall || fail "uninstall with PURGE=1"
	[[ ! -e /var/log/safe-run ]] || fail "PURGE=1 left /var/log/safe-run"
	! id safe-run 2>/dev/null || fail "PURGE=1 left the user safe-run"

	if ((failed == 0)); then
		echo "$PASS_LINE"
	fi
}

case ${1:-} in
--boot)
	boot "$2" "${3:-}"
	;;
--in-vm)
	# shellcheck source=scripts/vm.sh
	. "${BASH_SOURCE[0]%/*}/vm.sh"
	in_vm 2>&1
	exit 0
	;;
--verify)
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	sed "s|/usr/local/bin/safe-run|$PWD/bin/safe-run|" deploy/systemd/safe-run.service >"$tmp/safe-run.service"
	verify_unit "$tmp/safe-run.service"
	exit
	;;
esac

# ---- on the host ----

if [[ $(id -u) != 0 ]]; then
	echo "test-service: run as root: it boots a VM that installs a system service" >&2
	exit 1
fi
VM_NAME=test-service
GO=${GO:-go}
# shellcheck source=scripts/vm.sh
. scripts/vm.sh
vm_need_qemu
for f in bin/safe-run bin/safe-run-agent bin/safe-run-shim bin/runsc; do
	[[ -x $f ]] || {
		echo "test-service: $f is missing; run make build runsc rootfs first" >&2
		exit 1
	}
done
# The VM's client is the TypeScript SDK that make test's MCP clients
# (scripts/mcp-clients.sh) install with the Inspector; the VM has no network.
if [[ ! -e /var/cache/safe-run/npm-tools/node_modules/@modelcontextprotocol/sdk/package.json ]]; then
	echo "test-service: the TypeScript SDK is not in /var/cache/safe-run/npm-tools; run make test (its scripts/mcp-clients.sh installs it) first" >&2
	exit 1
fi
echo "== the unit, offline: systemd-analyze verify and exposure"
"$0" --verify
cache=$(bin/safe-run image dir)
start=$(date +%s)
work=$(mktemp -d /tmp/safe-run-service.XXXXXX)
cleanup() {
	vm_stop
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

vm_kernel "$work" "$cache" fs/overlayfs/overlay.ko drivers/net/veth.ko drivers/net/tun.ko
echo "== booting $(basename "$VM_KERNEL") in QEMU with systemd as process 1 (emulated CPU; slow)"
timeout="${TEST_SERVICE_TIMEOUT:-40m}"
vm_boot "$work" "$timeout" "console=ttyS0 panic=-1 quiet systemd.show_status=0 -- /bin/bash $PWD/scripts/test-service.sh --boot $PWD ${TEST_SERVICE_PROBE:-0}"
echo "== $(($(date +%s) - start)) s in all"
if ! grep -q "$PASS_LINE" "$work/console.log"; then
	[[ $VM_STATUS == 124 ]] && echo "test-service: the VM did not finish within $timeout" >&2
	echo "test-service: FAILED" >&2
	exit 1
fi
