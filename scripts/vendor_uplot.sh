#!/usr/bin/env bash
# Vendors uPlot from the npm registry into static/vendor/uplot/ (never a CDN: the dashboard must
# work on a network without the internet). Usage: scripts/vendor_uplot.sh [VERSION]
# Checks the tarball against the registry's published sha512 integrity before unpacking.
set -euo pipefail
VERSION="${1:-1.6.32}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/static/vendor/uplot"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

META="$(curl -fsSL "https://registry.npmjs.org/uplot/$VERSION")"
TARBALL="$(printf '%s' "$META" | python3 -c 'import json,sys; print(json.load(sys.stdin)["dist"]["tarball"])')"
INTEGRITY="$(printf '%s' "$META" | python3 -c 'import json,sys; print(json.load(sys.stdin)["dist"]["integrity"])')"
curl -fsSL "$TARBALL" -o "$WORK/uplot.tgz"
ACTUAL="sha512-$(openssl dgst -sha512 -binary "$WORK/uplot.tgz" | base64 -w0)"
if [ "$ACTUAL" != "$INTEGRITY" ]; then
    echo "uplot $VERSION: integrity mismatch (registry $INTEGRITY, got $ACTUAL)" >&2
    exit 1
fi
tar -xzf "$WORK/uplot.tgz" -C "$WORK"
rm -rf "$DEST"
mkdir -p "$DEST"
cp "$WORK/package/dist/uPlot.iife.min.js" "$WORK/package/dist/uPlot.min.css" "$WORK/package/LICENSE" "$DEST/"
printf '%s\n' "$VERSION" > "$DEST/VERSION"
echo "uplot $VERSION vendored into static/vendor/uplot/"
