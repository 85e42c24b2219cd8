#!/usr/bin/env bash
# scripts/plot-benchmarks.py still reads the benchmark tables in docs/ and
# draws both plots (PNG files, not empty). Exit 77 without gnuplot, except
# under CI, where that fails.
# usage: plot_test.sh SOURCE_DIR
set -euo pipefail
src=$1
if ! command -v gnuplot >/dev/null; then
    case "${CI:-}" in "" | 0 | false) echo "plot: no gnuplot; skipping"; exit 77 ;; esac
    echo "plot: FAIL: no gnuplot under CI (scripts/deps.sh installs gnuplot-nox)"
    exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 "$src/scripts/plot-benchmarks.py" --docs "$src/docs" --out "$out"
for f in http-put.png store-batch.png; do
    [ "$(head -c 8 "$out/$f" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
        { echo "plot: FAIL: $f is not a PNG"; exit 1; }
    [ "$(stat -c %s "$out/$f")" -gt 5000 ] || { echo "plot: FAIL: $f is nearly empty"; exit 1; }
done
echo "plot: ok"
