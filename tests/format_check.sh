#!/usr/bin/env bash
# The C sources follow .clang-format (docs/contributing.md): every
# .c and .h file under the given directory (default: the source root; the
# known-bad fixtures under tests/fixtures are left out) must come out of
# clang-format unchanged. Without clang-format the check skips (exit 77),
# except under CI, where a skipped check would pass silently: there it fails.
# Fix a failure with: clang-format -i FILE (scripts/deps.sh installs it).
set -u
root=${1:-.}
style=${2:-$root}
if ! command -v clang-format >/dev/null; then
    if [ -n "${CI:-}" ] && [ "${CI:-}" != false ] && [ "${CI:-}" != 0 ]; then
        echo "format: clang-format is not installed (scripts/deps.sh installs it)"
        exit 1
    fi
    echo "format: clang-format is not installed; skipped"
    exit 77
fi
mapfile -t files < <(find "$root" \( -name build -o -name 'build-*' -o -name .git \
    -o -path '*/tests/fixtures' -o -name data \) -prune -o \
    -type f \( -name '*.c' -o -name '*.h' \) -print | sort)
if [ "$root" != "$style" ]; then
    # A fixture directory: checked against the project's style file.
    args=(--style="file:$style/.clang-format")
else
    args=()
fi
bad=0
for f in "${files[@]}"; do
    if ! clang-format "${args[@]}" --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "format: $f differs from .clang-format (clang-format -i $f)"
        bad=$((bad + 1))
    fi
done
echo "format: ${#files[@]} files checked, $bad to reformat"
[ "$bad" -eq 0 ]
