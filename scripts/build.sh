#!/usr/bin/env bash
# Configures (or reconfigures) the release build in build/ and compiles it.
# SDIRECT_BUILD_DIR overrides the directory.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
dir="${SDIRECT_BUILD_DIR:-build}"

if [[ -f "$dir/meson-private/coredata.dat" ]]; then
    meson setup --reconfigure "$dir" --buildtype=release
else
    meson setup "$dir" --buildtype=release
fi
ninja -C "$dir"
