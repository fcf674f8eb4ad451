# Sourced by the benchmark scripts that compare configurations in
# interleaved rounds (cold-scan.sh, wal-resident-scan.sh, write-bench.sh):
# the rounds, each running every configuration once in an order rotated
# per round (so that no configuration always runs first or last on a
# machine whose speed drifts), and their summary table.

# run_rounds RAW ROUNDS FN CONFIG...: for each round and each CONFIG in
# that round's order, append "round config <what FN CONFIG prints>" to
# RAW (and a progress line to standard error). A failing FN stops the
# script under `set -e`.
run_rounds() {
  local raw=$1 rounds=$2 fn=$3
  shift 3
  local cl=("$@") k=$# r i c out
  for r in $(seq 1 "$rounds"); do
    for ((i = 0; i < k; i++)); do
      c=${cl[$(((i + r) % k))]}
      out=$("$fn" "$c")
      echo "$r $c $out" >>"$raw"
      echo "round $r $c: $out" >&2
    done
  done
}

# summarize_rounds RAW BASE COLUMN...: a markdown table of RAW's rounds:
# per configuration and per COLUMN (the values after the configuration,
# in order), the median and range of its values, and of BASE's value over
# the configuration's in the same round (above 1: faster than BASE). BASE
# is the first configuration when it did not run.
summarize_rounds() {
  python3 - "$@" <<'PY'
import statistics as st, sys
from collections import defaultdict
path, base, cols = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = defaultdict(dict)
for line in open(path):
    f = line.split()
    runs[f[0]][f[1]] = [float(x) for x in f[2:2 + len(cols)]]
configs = list(dict.fromkeys(c for v in runs.values() for c in v))
if base not in configs:
    base = configs[0]
def span(xs, fmt, unit=""):
    return f"{st.median(xs):{fmt}}{unit} ({min(xs):{fmt}}-{max(xs):{fmt}})"
print("| config | " + " | ".join(f"{c}: median (range) | {base} / it" for c in cols) + " |")
print("|---|" + "---|---|" * len(cols))
for c in configs:
    cells = []
    for j in range(len(cols)):
        xs = [v[c][j] for v in runs.values() if c in v]
        rs = [v[base][j] / v[c][j] for v in runs.values() if c in v and base in v and v[c][j] > 0]
        cells += [span(xs, ".3f"), span(rs, ".2f", "x") if c != base and rs else ""]
    print(f"| {c} | " + " | ".join(cells) + " |")
PY
}
