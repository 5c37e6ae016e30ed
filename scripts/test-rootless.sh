#!/usr/bin/env bash
# test-rootless.sh — run the integration tests again as an ordinary user, the
# way a desktop MCP client starts safe-run: uid 65534, no groups, no sudo, no
# setuid helper, a home and runtime directory of its own.
#
#   scripts/test-rootless.sh            (as root, after `make test` built everything)
#
# Root builds the test binaries and installs safe-run, the agent and runsc with
# `make install` into a directory the user can read; the user then runs them
# against the default image root built, used read-only (SAFE_RUN_CACHE). Every
# test of both binaries runs: the gVisor backend's tests (sandboxes, limits, isolation
# probes, sessions), the end-to-end tests of the binary (CLI and MCP over stdio
# and HTTP), and the threat suite — every threat case through both paths with
# its host checks and positive controls (run as the user, and for runsc as
# root of a user namespace of the user's), the seccomp controls, and the host
# faults with their state in $XDG_RUNTIME_DIR. Where a limit is weaker without
# root (README, "Without root"), the test asserts what holds instead and logs
# the sub-check that cannot apply. Every test that passes as root must pass here.
# Extra arguments go to both test binaries, e.g. -test.run='^TestThreats$' -test.v.
#
# Then, as the same user: a short soak (the mix of `make soak`), the MCP
# clients of `make test` (the inspector over stdio and HTTP, the conformance
# suite), and `make demo` in a checkout of the user's own, which builds runsc
# and the default image without root into the user's caches ($SAFE_RUN_USER_CACHE, default /var/cache/safe-run-user).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
USER_ID=65534
# The user's caches (Go's and safe-run's images), kept between runs.
USER_CACHE=${SAFE_RUN_USER_CACHE:-/var/cache/safe-run-user}
# How many runs the user's soak makes (root's is `make soak`).
ROOTLESS_SOAK_RUNS=${ROOTLESS_SOAK_RUNS:-120}

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
# Each test binary runs, as `go test` runs it, in its package's directory
# of a tree laid out as the repository's, holding a copy of its testdata and
# the scripts tests run (the user's to write in).
for pkg in runtime/gvisor cmd/safe-run; do
	t=$(basename "$pkg")
	"$GO" test -c -o "$work/$t.test" "./$pkg"
	mkdir -p "$work/src/$pkg"
	if [[ -d $pkg/testdata ]]; then
		cp -r "$pkg/testdata" "$work/src/$pkg/"
	fi
done
mkdir -p "$work/src/scripts"
cp scripts/mcp-run.mjs "$work/src/scripts/"
chown -R "$USER_ID:$USER_ID" "$work/src"
pkgdir() { case $1 in gvisor) echo "$work/src/runtime/gvisor" ;; safe-run) echo "$work/src/cmd/safe-run" ;; esac; }
mkdir -p "$work/home" "$work/run"
chown "$USER_ID:$USER_ID" "$work/home" "$work/run"
chmod 700 "$work/run"

as_user() {
	setpriv --reuid="$USER_ID" --regid="$USER_ID" --clear-groups \
		env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work/home" TMPDIR="$work/home" \
		XDG_RUNTIME_DIR="$work/run" SAFE_RUN_CACHE="$cache" \
		SAFE_RUN_INTEGRATION=1 SAFE_RUN_BIN="$work/bin/safe-run" \
		SAFE_RUN_RUNSC="$work/bin/runsc" SAFE_RUN_AGENT="$work/bin/safe-run-agent" \
		SAFE_RUN_NET_HELPER="$work/bin/safe-run-net" "$@"
}

echo "== as uid $USER_ID: safe-run doctor"
(cd "$work/home" && as_user "$work/bin/safe-run" doctor)
status=0
for t in gvisor safe-run; do
	echo "== as uid $USER_ID: $t tests"
	(cd "$(pkgdir "$t")" && as_user "$work/$t.test" -test.count=1 -test.timeout=40m \
		"$@") || status=1
done
# The network tests once more with /dev/net/tun open to everyone, as stock
# distributions ship it (0666): the user's sandboxes then get a TAP instead of
# the veth they get where it is 0600, as on this CI machine. The mode is put
# back however the tests end.
tun_mode=$(stat -c %a /dev/net/tun 2>/dev/null || true)
if [[ -n $tun_mode && $tun_mode != 666 ]]; then
	# shellcheck disable=SC2064
	trap "chmod '$tun_mode' /dev/net/tun; rm -rf '$work'" EXIT
	chmod 0666 /dev/net/tun
	for t in gvisor safe-run; do
		echo "== as uid $USER_ID, /dev/net/tun 0666: $t network tests"
		(cd "$(pkgdir "$t")" && as_user "$work/$t.test" -test.count=1 -test.timeout=20m \
			-test.run='Network|Install') || status=1
	done
	chmod "$tun_mode" /dev/net/tun
fi
# The soak's mix (every language and ending, networked runs among them)
# through one server of the user's: networked sandboxes' namespaces are made
# differently in a user namespace, and a rootless server once killed its
# other sandboxes with the threads it made them on.
echo "== as uid $USER_ID: soak, $ROOTLESS_SOAK_RUNS mixed runs through one MCP server"
(cd "$(pkgdir safe-run)" && as_user env SAFE_RUN_SOAK_RUNS="$ROOTLESS_SOAK_RUNS" "$work/safe-run.test" \
	-test.count=1 -test.timeout=20m -test.run='^TestSoak$' -test.v) || status=1

# Independent MCP clients against the user's server, as `make test` runs them
# for root: the inspector over stdio (it starts `safe-run serve` itself, as a
# desktop client does) and over HTTP, and the conformance suite. The npm tools
# root installed are used read-only.
echo "== as uid $USER_ID: MCP clients"
mkdir -p "$work/repo/scripts" "$work/repo/.ci"
cp scripts/mcp-clients.sh "$work/repo/scripts/"
cp .ci/conformance-baseline.yml "$work/repo/.ci/"
(cd "$work/home" && as_user "$work/repo/scripts/mcp-clients.sh" "$work/bin/safe-run") || status=1

# `make demo` in a checkout of the user's own, with nothing of root's but a
# copy of its Go build cache (below): the user builds safe-run, runsc and the
# default image (mmdebstrap, no root) into caches of its own. Those caches
# ($USER_CACHE, owned by the user) outlive the run, so later runs rebuild
# only what changed, as root's /var/cache/safe-run.
echo "== as uid $USER_ID: make demo in its own checkout, image in its own cache"
# The user builds the image with mmdebstrap in fakechroot mode (nobody has no
# /etc/subuid range), which root installs once, as `make test` installs what
# root's build needs: the user cannot, and a host that had them by hand would
# hide the step.
need=()
for tool in mmdebstrap fakechroot fakeroot; do
	command -v "$tool" >/dev/null || need+=("$tool")
done
if ((${#need[@]})); then
	echo "[deps] apt-get install ${need[*]} (the user's image build)" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$USER_CACHE"
chown "$USER_ID:$USER_ID" "$USER_CACHE"
# The user's Go build cache starts as a copy of root's: what the demo checks
# is that the user can build everything without root, and the compiler's
# outputs for the same sources and flags (every build is -trimpath) do not
# depend on who runs it. On a fresh machine the copy spares the demo most of
# a second compilation of runsc and safe-run (the demo took 7.3 minutes
# against 12); later runs keep the user's own cache. A copy, never a link: the user must not be able to
# change root's cache.
root_gocache=$("$GO" env GOCACHE)
if [[ ! -e $USER_CACHE/go-build && -d $root_gocache ]]; then
	seed_start=$SECONDS
	rm -rf "$USER_CACHE/go-build.partial"
	cp -R "$root_gocache" "$USER_CACHE/go-build.partial"
	chown -R "$USER_ID:$USER_ID" "$USER_CACHE/go-build.partial"
	mv "$USER_CACHE/go-build.partial" "$USER_CACHE/go-build"
	echo "== the user's Go build cache seeded from root's ($(du -sh "$USER_CACHE/go-build" | cut -f1)) in $((SECONDS - seed_start)) s"
fi
mkdir "$work/home/safe-run"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$work/home/safe-run"
chown -R "$USER_ID:$USER_ID" "$work/home/safe-run"
go_env=()
for name in GOFLAGS GOPROXY GOSUMDB GONOSUMDB GOPRIVATE GOTOOLCHAIN; do
	[[ -n ${!name:-} ]] && go_env+=("$name=${!name}")
done
demo_start=$SECONDS
if (cd "$work/home/safe-run" && as_user env -u SAFE_RUN_CACHE "${go_env[@]}" \
	PATH="$(dirname "$(command -v "$GO")"):/usr/local/bin:/usr/bin:/bin" \
	XDG_CACHE_HOME="$USER_CACHE" GOCACHE="$USER_CACHE/go-build" GOMODCACHE="$USER_CACHE/go-mod" \
	make --no-print-directory demo) >"$work/demo.log" 2>&1; then
	tail -n 12 "$work/demo.log"
	if ! grep -q "^hello from .* as uid 65534$" "$work/demo.log"; then
		echo "test-rootless: make demo did not print the sandbox's greeting" >&2
		status=1
	fi
else
	tail -n 40 "$work/demo.log"
	echo "test-rootless: make demo failed as uid $USER_ID" >&2
	status=1
fi
echo "== make demo as uid $USER_ID: $((SECONDS - demo_start)) s"

leftover=$(pgrep -u "$USER_ID" -af "$work" || true)
if [[ -n $leftover ]]; then
	echo "test-rootless: processes of uid $USER_ID left running:" >&2
	echo "$leftover" >&2
	status=1
fi
exit $status
