#!/usr/bin/env bash
# build-rootfs.sh — the recipe for safe-run's default image, and its cache check.
#
#   rootfs/build-rootfs.sh             build the image if the cache lacks it, then import it
#   rootfs/build-rootfs.sh --key       print the recipe key (a hash of this file)
#   rootfs/build-rootfs.sh --archive OUT.tar.gz
#                                      only build the archive (for another machine)
#   rootfs/build-rootfs.sh --root DIR  only build the image's root in DIR, as root
#                                      (what `safe-run image build default` does as root)
#
# This file *is* the recipe: the image is cached under a hash of its bytes, so
# any edit here produces a new image and leaves the old one alone. As root the
# build uses debootstrap; as an ordinary user, mmdebstrap in its unshare mode
# (needs newuidmap from the uidmap package and a range in /etc/subuid, which
# adduser gives every user) or, failing that, its fakechroot mode (needs
# fakechroot and fakeroot). Either way the Debian archive must be reachable;
# SAFE_RUN_DEBIAN_MIRROR picks a mirror. SAFE_RUN names the safe-run binary
# (default: bin/safe-run beside this script).
set -euo pipefail

SUITE=bookworm
# bash and coreutils come with minbase. matplotlib pulls in its fonts. pip, npm,
# curl, requests and the CA store are for runs with a network (see docs/network.md).
PACKAGES=(python3 python3-numpy python3-pandas python3-matplotlib python3-pytest nodejs
	python3-pip python3-requests npm curl ca-certificates)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
key=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
safe_run=${SAFE_RUN:-$here/../bin/safe-run}

log() { printf '[rootfs %s] %s\n' "$(date +%T)" "$*" >&2; }

# configure ROOT: what both builders do once the packages are installed and
# apt has cleaned up after itself.
configure() {
	local root=$1
	# matplotlib draws to files only: there is no display in the sandbox.
	printf 'backend: Agg\n' >"$root/etc/matplotlibrc"
	rm -rf "$root"/var/log/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
		"$root"/var/tmp/* "$root"/root/.cache
	# No device nodes, fifos or sockets: the sandbox brings its own /dev.
	find "$root" -xdev \( -type b -o -type c -o -type p -o -type s \) -delete
	# No setuid/setgid programs: nothing inside may gain privileges.
	find "$root" -xdev -type f -perm /6000 -exec chmod ug-s {} +
}

# mmdebstrap_mode prints how an ordinary user can run mmdebstrap here.
mmdebstrap_mode() {
	if command -v newuidmap >/dev/null && grep -q "^$(id -un):" /etc/subuid 2>/dev/null; then
		echo unshare
	elif command -v fakechroot >/dev/null && command -v fakeroot >/dev/null; then
		echo fakechroot
	fi
}

# build_archive_unprivileged OUT: the same image, built by an ordinary user.
build_archive_unprivileged() {
	local out=$1 mode
	mode=$(mmdebstrap_mode)
	if ! command -v mmdebstrap >/dev/null || [[ -z $mode ]]; then
		echo "build-rootfs: building the image without root needs mmdebstrap, and either uidmap (with a range for $(id -un) in /etc/subuid) or fakechroot and fakeroot;" \
			"have them installed once (apt-get install mmdebstrap uidmap), or import an archive built elsewhere with: safe-run image import --name default FILE" >&2
		exit 1
	fi
	log "mmdebstrap --mode=$mode $SUITE (minbase) with ${PACKAGES[*]}"
	mkdir -p "$(dirname "$out")"
	local packages
	packages=$(IFS=,; echo "${PACKAGES[*]}")
	# shellcheck disable=SC2016
	mmdebstrap --mode="$mode" --variant=minbase --include="$packages" \
		--aptopt='APT::Install-Recommends "false"' \
		--customize-hook="$(declare -f configure); configure \"\$1\"" \
		"$SUITE" "$out.partial.tar.gz" ${SAFE_RUN_DEBIAN_MIRROR:+"$SAFE_RUN_DEBIAN_MIRROR"} 2>&1 |
		grep --line-buffered -E '^(E|W): |^I: (downloading|extracting|installing|running|creating|success)' |
		sed -u 's/^/[rootfs] /' >&2 || {
		rm -f "$out.partial.tar.gz"
		echo "build-rootfs: mmdebstrap failed (see its E: lines above)" >&2
		exit 1
	}
	mv "$out.partial.tar.gz" "$out"
	log "archive ready: $(du -h "$out" | cut -f1)"
}

# build_root ROOT: the image, built by root with debootstrap into the empty
# or missing directory ROOT.
build_root() {
	local root=$1
	command -v debootstrap >/dev/null || { echo "build-rootfs: debootstrap is missing; install it: apt-get install -y debootstrap" >&2; exit 1; }

	log "debootstrap $SUITE (minbase) into $root"
	debootstrap --variant=minbase "$SUITE" "$root" ${SAFE_RUN_DEBIAN_MIRROR:+"$SAFE_RUN_DEBIAN_MIRROR"} |
		grep --line-buffered -E '^I: (Retrieving|Validating|Extracting|Installing|Configuring|Base system)' |
		awk '{ n++; if (n % 25 == 1 || /Base system/) { print "[rootfs] " $0; fflush() } }' >&2

	log "installing ${PACKAGES[*]}"
	cp /etc/resolv.conf "$root/etc/resolv.conf"
	printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
	chmod 755 "$root/usr/sbin/policy-rc.d"
	chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	chroot "$root" env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" |
		grep --line-buffered -E '^(Setting up|Need to get)' |
		awk '{ n++; if (n % 20 == 1) { print "[rootfs] " $0; fflush() } }' >&2

	log "configuring and cleaning"
	rm -f "$root/usr/sbin/policy-rc.d"
	: >"$root/etc/resolv.conf"
	chroot "$root" apt-get clean
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/tmp/*
	# numpy finds BLAS through /etc/ld.so.cache (mmdebstrap writes it itself).
	chroot "$root" ldconfig
	configure "$root"
	log "image ready in $root"
}

build_archive() {
	local out=$1
	if [[ $(id -u) != 0 ]]; then
		build_archive_unprivileged "$out"
		return
	fi
	local work
	work=$(mktemp -d /var/tmp/safe-run-rootfs.XXXXXX)
	# shellcheck disable=SC2064
	trap "rm -rf '$work'" EXIT
	local root=$work/root
	build_root "$root"

	log "writing $out"
	mkdir -p "$(dirname "$out")"
	local gz=gzip
	command -v pigz >/dev/null && gz=pigz
	tar --numeric-owner --one-file-system -C "$root" -cf - . | "$gz" -1 >"$out.partial"
	mv "$out.partial" "$out"
	log "archive ready: $(du -h "$out" | cut -f1)"
}

case "${1:-}" in
--key)
	echo "$key"
	;;
--archive)
	build_archive "${2:?usage: build-rootfs.sh --archive OUT.tar.gz}"
	;;
--root)
	[[ $(id -u) == 0 ]] || { echo "build-rootfs: --root builds with debootstrap, as root; as another user, build an archive with --archive OUT.tar.gz" >&2; exit 1; }
	build_root "${2:?usage: build-rootfs.sh --root DIR}"
	;;
"")
	[[ -x $safe_run ]] || { echo "build-rootfs: $safe_run is missing; run: make bin/safe-run" >&2; exit 1; }
	if "$safe_run" image check --name default --key "$key" >/dev/null 2>&1; then
		log "default image $key is up to date"
		exit 0
	fi
	archive="$("$safe_run" image dir)/archives/default-$key.tar.gz"
	if [[ ! -s $archive ]]; then
		build_archive "$archive"
	else
		log "reusing archive $archive"
	fi
	"$safe_run" image import --name default --key "$key" "$archive"
	;;
*)
	sed -n '2,9p' "${BASH_SOURCE[0]}" >&2
	exit 2
	;;
esac
