#!/usr/bin/env bash
# Build a minimal Debian bookworm image with Python 3.11 (+ venv) from the Debian mirror, for
# machines that cannot pull images from a registry (no Docker Hub, but a Debian mirror).
#
#   scripts/make-base-image.sh [TAG] [CACHE_DIR]
#     TAG        image to create (default searchr1-base:bookworm)
#     CACHE_DIR  where the root filesystem tarball is kept between runs (default .cache/docker)
# Called by scripts/docker-e2e.sh when BASE_IMAGE cannot be pulled. Needs root (debootstrap,
# chroot). The tarball is cached, so a rerun only does `docker import` (seconds).
# MIRROR overrides the mirror; by default the one apt already uses on this machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tag="${1:-searchr1-base:bookworm}"
cache="${2:-$here/.cache/docker}"
tarball="$cache/debian-bookworm-python3.tar"

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "make-base-image: $tag already present"
    exit 0
fi

mirror_from_apt() {
    # The first Debian main archive in apt's sources (deb822 "URIs:" or one-line "deb" entries;
    # comments skipped). Empty when there is none.
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        sed -nE 's#^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)(https?://[^[:space:]]+/debian)/?([[:space:]].*)?$#\3#p' |
        head -n1 || true
}

if [[ ! -s "$tarball" ]]; then
    command -v debootstrap >/dev/null || {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    mirror="${MIRROR:-$(mirror_from_apt)}"
    mirror="${mirror:-http://deb.debian.org/debian}"
    mkdir -p "$cache"
    root="$(mktemp -d "$cache/rootfs.XXXXXX")"
    trap 'rm -rf "$root"' EXIT
    echo "make-base-image: debootstrap bookworm from $mirror (about a minute)"
    debootstrap --variant=minbase --include=python3,python3-venv \
        bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
        tail -n 20 "$cache/debootstrap.log" >&2
        exit 1
    }
    # What an image never needs: package caches and lists, docs, man pages, locales.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
fi

docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    "$tarball" "$tag" >/dev/null
echo "make-base-image: imported $tag ($(du -h "$tarball" | cut -f1) rootfs)"
