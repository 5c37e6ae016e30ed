#!/usr/bin/env bash
# test-rootless.sh — run the integration tests again as an ordinary user, the
# way a desktop MCP client starts safe-run: uid 65534, no groups, no sudo, no
# setuid helper, a home and runtime directory of its own.
#
#   scripts/test-rootless.sh            (as root, after `make test` built everything)
#
# Root builds the test binaries and installs safe-run, the agent and runsc with
# `make install` into a directory the user can read; the user then runs them
# against the default image root built, used read-only (SAFE_RUN_CACHE). The
# runtime tests (sandboxes, limits, isolation probes, sessions) and the
# end-to-end tests of the binary (CLI and MCP over stdio and HTTP) run; every
# test that passes as root must pass here. Not yet the threat suite (TestThreat*,
# TestSeccomp*, TestFault*): its harness assumes root (host cgroups, runsc run
# directly for its positive controls) and is not adapted to an ordinary user.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
USER_ID=65534

if [[ $(id -u) != 0 ]]; then
	echo "test-rootless: run as root: it switches to uid $USER_ID itself" >&2
	exit 1
fi
cache=$(bin/safe-run image dir)

work=$(mktemp -d /tmp/safe-run-rootless.XXXXXX)
# shellcheck disable=SC2064
trap "rm -rf '$work'" EXIT
chmod 755 "$work"
make --no-print-directory install PREFIX="$work" >/dev/null
for pkg in runtime cmd/safe-run; do
	"$GO" test -c -o "$work/$(basename "$pkg").test" "./$pkg"
done
mkdir -p "$work/home" "$work/run"
chown "$USER_ID:$USER_ID" "$work/home" "$work/run"
chmod 700 "$work/run"

as_user() {
	setpriv --reuid="$USER_ID" --regid="$USER_ID" --clear-groups \
		env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work/home" TMPDIR="$work/home" \
		XDG_RUNTIME_DIR="$work/run" SAFE_RUN_CACHE="$cache" \
		SAFE_RUN_INTEGRATION=1 SAFE_RUN_BIN="$work/bin/safe-run" \
		SAFE_RUN_RUNSC="$work/bin/runsc" SAFE_RUN_AGENT="$work/bin/safe-run-agent" "$@"
}

echo "== as uid $USER_ID: safe-run doctor"
(cd "$work/home" && as_user "$work/bin/safe-run" doctor)
status=0
for t in runtime safe-run; do
	echo "== as uid $USER_ID: $t tests"
	(cd "$work/home" && as_user "$work/$t.test" -test.count=1 -test.timeout=40m \
		-test.skip='^(TestThreat|TestSeccomp|TestFault)') || status=1
done
leftover=$(pgrep -u "$USER_ID" -af "$work" || true)
if [[ -n $leftover ]]; then
	echo "test-rootless: processes of uid $USER_ID left running:" >&2
	echo "$leftover" >&2
	status=1
fi
exit $status
