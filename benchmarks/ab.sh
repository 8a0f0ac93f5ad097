#!/usr/bin/env bash
# Alternating A/B of two checkouts of npusim (e.g. a worktree of the old commit and this one):
# each round runs hccl.bench once with each, so drift of the machine hits both alike.
#   bash benchmarks/ab.sh OLD_DIR NEW_DIR [WORLDS=2,4] [SIZES=1K,64K,1M,16M] [ROUNDS=3] [OPS=all_reduce]
# e.g. git worktree add --detach /tmp/old aa38595 && bash benchmarks/ab.sh /tmp/old .
#      bash benchmarks/ab.sh /work/main . 2,4 64K 5 broadcast,all_gather
# Extra environment for the new side only: AB_NEW_ENV="NPUSIM_SCHED_BATCH=0".
# Prints each run's median time per size (us) and, per collective, world and size, the ratio of
# the medians (hccl.bench's sizes: AllGather's is the gathered buffer).
set -euo pipefail
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
worlds=${3:-2,4}; sizes=${4:-1K,64K,1M,16M}; rounds=${5:-3}; ops=${6:-all_reduce}
out=$(mktemp -d /tmp/npusim-ab.XXXXXX)
for r in $(seq "$rounds"); do
  for o in ${ops//,/ }; do
    for w in ${worlds//,/ }; do
      for side in old new; do
        dir=$old; extra=""; [ "$side" = new ] && dir=$new && extra=${AB_NEW_ENV:-}
        (cd "$dir" && env PYTHONPATH="$dir" $extra python -m launcher --nproc-per-node "$w" \
          -m hccl.bench -o "$o" --sizes "$sizes" --timing median --target-s 0.4 \
          --json "$out/$side~$o~$w~$r.json" > "$out/$side~$o~$w~$r.log" 2>&1) ||
          echo "run $side $o world $w round $r failed: $out/$side~$o~$w~$r.log" >&2
      done
    done
  done
done
python - "$out" <<'PY'
import collections, glob, json, os, statistics, sys
d = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    side, op, w, _ = os.path.basename(f)[:-5].split("~")
    for row in json.load(open(f))["results"]:
        d[(op, int(w), row["bytes"], side)].append(row["time_us"])
print("| collective | world | bytes | old (us) | new (us) | new / old (medians) |\n"
      "|---|---|---|---|---|---|")
for (op, w, b, side) in sorted(k for k in d if k[3] == "old"):
    o, n = d[(op, w, b, "old")], d.get((op, w, b, "new"), [])
    if n:
        print(f"| {op} | {w} | {b} | {' / '.join(f'{x:.0f}' for x in o)} | "
              f"{' / '.join(f'{x:.0f}' for x in n)} | {statistics.median(n) / statistics.median(o):.2f} |")
PY
rm -rf "$out"
