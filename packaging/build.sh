#!/usr/bin/env bash
# Configures, builds (warnings are errors) and installs the plugin and its tools into PREFIX.
# The one build recipe for packaging: packaging/Dockerfile runs it, and so does CI through
# the ctest unit_packaging_build, so the image's build steps cannot rot.
#   packaging/build.sh PREFIX [BUILD_DIR]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${1:?usage: packaging/build.sh PREFIX [BUILD_DIR]}
BUILD=${2:-$SRC/build-package}
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DERDMA_WERROR=ON -DERDMA_TESTS=OFF \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib
cmake --build "$BUILD" -j"$(nproc)"
cmake --install "$BUILD"
for f in lib/libnccl-net-erdma.so bin/nccl-erdma-doctor bin/nccl-erdma-params; do
    [ -e "$PREFIX/$f" ] || { echo "build.sh: $PREFIX/$f was not installed" >&2; exit 1; }
done
echo "build.sh: installed into $PREFIX"
