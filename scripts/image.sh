#!/usr/bin/env bash
# Builds Herald's container image without a container engine: a scratch-style root file
# system of the binaries, the shared libraries they load (as ldd resolves them on this
# machine, whose Debian release the Dockerfile's runtime image matches), `sleep` for the
# chart's preStop hook, CA certificates, and the user 10001 the chart runs as; then an
# OCI image archive of it (scripts/oci-image.py). The Dockerfile builds the same layout
# for those who have Docker.
#
# usage: scripts/image.sh [BIN_DIR [OUT_DIR]]
#   BIN_DIR  the binaries (default target/release; `cargo build --release --locked --bins`)
#   OUT_DIR  where rootfs/ and herald-<version>.oci.tar go (default target/image)
# VERSION, GIT_COMMIT and CREATED label the image (defaults: the workspace's version,
# the checkout's commit, now); SOURCE_DATE_EPOCH clamps file times (reproducible digests).
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${1:-target/release}
out=${2:-target/image}
version=${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}
commit=${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
created=${CREATED:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
binaries=(herald-gateway herald-worker herald-loadtest)

rootfs="$out/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/usr/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
for b in "${binaries[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "$bin_dir/$b is missing: build the binaries first" >&2; exit 1; }
  install -m 0755 "$bin_dir/$b" "$rootfs/usr/local/bin/$b"
done
install -m 0755 "$(command -v sleep)" "$rootfs/usr/bin/sleep"

# Every library a binary loads, at the path the loader looks for it (the loader too).
libs=$(for f in "$rootfs"/usr/local/bin/* "$rootfs/usr/bin/sleep"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
done | sort -u)
for lib in $libs; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done

# The chart's user and group (podSecurityContext runAsUser/runAsGroup), by name too.
printf 'root:x:0:0:root:/:/usr/sbin/nologin\nherald:x:10001:10001:herald:/:/usr/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nherald:x:10001:\n' > "$rootfs/etc/group"
# The system's trust roots (rustls-native-certs reads them; a CA file overrides).
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
else
  echo "warning: no /etc/ssl/certs/ca-certificates.crt (apt-get install ca-certificates); the image trusts no public CA" >&2
fi

python3 scripts/oci-image.py build "$rootfs" "$out/herald-$version.oci.tar" \
  --version "$version" --revision "$commit" --created "$created"
