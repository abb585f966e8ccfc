#!/usr/bin/env bash
# CI runs the Dockerfile's build step: packaging/build.sh into a temporary prefix, then
# the installed plugin must load like NCCL loads it and the installed doctor must run.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PROBE=${PLUGIN_PROBE:?set by ctest}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$SRC/packaging/build.sh" "$tmp/prefix" "$tmp/build" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
LD_LIBRARY_PATH=$tmp/prefix/lib "$PROBE" libnccl-net-erdma.so
version=$("$tmp/prefix/bin/nccl-erdma-doctor" --version)
grep -q '^nccl-erdma-doctor ' <<<"$version"
table=$("$tmp/prefix/bin/nccl-erdma-params" --markdown)
grep -q NCCL_ERDMA_MTU_GUARD <<<"$table"
# the Dockerfile must still call this script
grep -q 'packaging/build.sh' "$SRC/packaging/Dockerfile"
echo "packaging/build.sh: OK"
