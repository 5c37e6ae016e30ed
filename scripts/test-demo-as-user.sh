#!/usr/bin/env bash
# test-demo-as-user.sh [--deps] — `make demo` as an ordinary user (uid 65534,
# no groups, no sudo) in a checkout of its own, with nothing of root's: the
# user builds safe-run, runsc and the default image (mmdebstrap in fakechroot
# mode, no root) into caches of its own, then runs a sandbox. Those caches
# ($SAFE_RUN_USER_CACHE, default /var/cache/safe-run-user, owned by the user)
# outlive the run, so later runs rebuild only what changed, as root's
# /var/cache/safe-run.
#
# Run as root: root installs the image build's tools once (mmdebstrap,
# fakechroot, fakeroot), as `make test` installs what root's build needs; the
# user cannot, and a host that had them by hand would hide the step. --deps
# installs them and stops, so that a caller can hold apt's lock in the
# foreground and run the demo itself beside other work.
#
# `make test-rootless` runs it last. CI runs it from its start, in the
# background at the lowest CPU priority: on a fresh machine the user's
# builds take about 12 minutes, most of them while CI's tests leave a CPU
# idle.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
USER_ID=65534
USER_CACHE=${SAFE_RUN_USER_CACHE:-/var/cache/safe-run-user}

if [[ $(id -u) != 0 ]]; then
	echo "test-demo-as-user: run as root: it switches to uid $USER_ID itself" >&2
	exit 1
fi

need=()
for tool in mmdebstrap fakechroot fakeroot; do
	command -v "$tool" >/dev/null || need+=("$tool")
done
if ((${#need[@]})); then
	echo "[deps] apt-get install ${need[*]} (the user's image build)" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[[ ${1:-} == --deps ]] && exit 0

echo "== as uid $USER_ID: make demo in its own checkout, image in its own cache"
work=$(mktemp -d /tmp/safe-run-demo.XXXXXX)
# shellcheck disable=SC2064
trap "rm -rf '$work'" EXIT
chmod 755 "$work"
mkdir -p "$work/home/safe-run" "$work/run" "$USER_CACHE"
chmod 700 "$work/run"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$work/home/safe-run"
chown -R "$USER_ID:$USER_ID" "$work/home" "$work/run"
chown "$USER_ID:$USER_ID" "$USER_CACHE"
go_env=()
for name in GOFLAGS GOPROXY GOSUMDB GONOSUMDB GOPRIVATE GOTOOLCHAIN; do
	[[ -n ${!name:-} ]] && go_env+=("$name=${!name}")
done
start=$SECONDS
status=0
if (cd "$work/home/safe-run" && setpriv --reuid="$USER_ID" --regid="$USER_ID" --clear-groups \
	env -i "${go_env[@]}" PATH="$(dirname "$(command -v "$GO")"):/usr/local/bin:/usr/bin:/bin" \
	HOME="$work/home" TMPDIR="$work/home" XDG_RUNTIME_DIR="$work/run" \
	XDG_CACHE_HOME="$USER_CACHE" GOCACHE="$USER_CACHE/go-build" GOMODCACHE="$USER_CACHE/go-mod" \
	make --no-print-directory demo) >"$work/demo.log" 2>&1; then
	tail -n 12 "$work/demo.log"
	if ! grep -q "^hello from .* as uid 65534$" "$work/demo.log"; then
		echo "test-demo-as-user: make demo did not print the sandbox's greeting" >&2
		status=1
	fi
else
	tail -n 40 "$work/demo.log"
	echo "test-demo-as-user: make demo failed as uid $USER_ID" >&2
	status=1
fi
echo "== make demo as uid $USER_ID: $((SECONDS - start)) s"

leftover=$(pgrep -u "$USER_ID" -af "$work" || true)
if [[ -n $leftover ]]; then
	echo "test-demo-as-user: processes of uid $USER_ID left running:" >&2
	echo "$leftover" >&2
	status=1
fi
exit $status
