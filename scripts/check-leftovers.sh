#!/usr/bin/env bash
# check-leftovers.sh — fail if any safe-run sandbox left something on this
# host: a runsc process, a network helper (safe-run-net), a process of the
# kubernetes tests' control plane, a run's cgroup (or CI's idle one), a
# mount (the null or the per-sandbox network namespace), a sandbox link's
# address in the host's network namespace, a per-run state directory, or a
# monitor's socket directory in the temporary directory (made where the
# state directory's path is too long for a socket).
set -uo pipefail
state=${SAFE_RUN_STATE_DIR:-/run/safe-run}
bad=0
report() { echo "left behind: $*" >&2; bad=1; }

while read -r pid args; do
	report "process $pid: $args"
done < <(pgrep -a -f 'runsc .*safe-run-[0-9a-f]{8}-' || true)
while read -r pid args; do
	report "network helper $pid: $args"
done < <(pgrep -a -x safe-run-net || true)
# make test-kubernetes's control plane (runtime/kubernetes/kubetest), from
# the binaries' cache directory named by their versions.
while read -r pid args; do
	report "control plane process $pid: $args"
done < <(pgrep -a -f '^[^ ]*/etcd-v[^/ ]*\.kube-v[^/ ]*/bin/' || true)
# A sandbox's link lives in its own network namespace, which goes with its
# last process; its address (198.18.0.0/15) in the host's is a leak.
while read -r line; do
	report "link address $line"
done < <(ip -o addr show 2>/dev/null | grep -E ' inet 198\.1[89]\.' || true)
while read -r dir; do
	report "cgroup $dir"
done < <(find /sys/fs/cgroup -maxdepth 8 -type d \( -name 'safe-run-*' -o -name 'ci-idle.*' \) 2>/dev/null)
while read -r line; do
	report "mount $line"
done < <(grep -E 'safe-run-[0-9a-f]{8}-' /proc/self/mountinfo || true)
if [[ -d $state ]]; then
	while read -r dir; do
		report "state directory $dir"
	done < <(find "$state" -mindepth 1 -maxdepth 1)
fi
while read -r dir; do
	report "monitor socket directory $dir"
done < <(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'safe-run-mon-*' 2>/dev/null)
if ((bad)); then
	exit 1
fi
echo "nothing left behind: no runsc process, network helper, control plane process, cgroup, mount, link, state directory or monitor socket directory of a run" >&2
