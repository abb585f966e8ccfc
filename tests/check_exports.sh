#!/usr/bin/env bash
# The plugin must export exactly ncclNetPlugin_v8..v12 (NCCL looks them up with dlsym).
set -euo pipefail
lib=$1
got=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
want=$(printf 'ncclNetPlugin_v%s\n' 10 11 12 8 9 | sort)
if [ "$got" != "$want" ]; then
  echo "FAIL: $lib exports:"; echo "$got"; echo "expected:"; echo "$want"; exit 1
fi
echo "OK: $lib exports exactly: $(echo $got)"
