#!/usr/bin/env bash
# Every first-party C file must be clang-format clean (.clang-format at the root).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.c' '*.h' '*.cc' 2>/dev/null || find src include tests bench tools -name '*.[ch]' -o -name '*.cc')
[ -n "$files" ] || { echo "no C files?"; exit 1; }
bad=0
for f in $files; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then echo "not formatted: $f"; bad=1; fi
done
[ $bad = 0 ] && echo "clang-format: $(echo "$files" | wc -w) files clean"
exit $bad
