#!/bin/bash
# The write path's same-run A/B (BENCHMARKS.md, "The write path since"): 3996fe6 (old) vs main (new),
# rounds alternated old/new: make loadtest's churn (policy writes at 100/s) at 10k and 1k Decide/s, and
# workload-churn (1,000 workload puts/s asked, 32 writers) with a CPU profile of the new verdictd
# (verdictd's CPU per put = the profile's total samples / the puts of the report). Needs a worktree of
# 3996fe6: git -C /work/main worktree add /work/wt/ab-old2 3996fe6. Output: $OUT.
set -u
OLD=${OLD:-/work/wt/ab-old2}; NEW=${NEW:-/work/main}; OUT=${OUT:-/tmp/writepath-ab}; mkdir -p $OUT/bin/old $OUT/bin/new
(cd $OLD && go build -o $OUT/bin/old/ ./cmd/verdictd ./cmd/verdict-loadtest) || exit 1
(cd $NEW && go build -o $OUT/bin/new/ ./cmd/verdictd ./cmd/verdict-loadtest) || exit 1
for rate in 10000 1000; do
  for round in 1 2 3; do
    for side in old new; do
      echo "== churn-rate $rate round $round $side $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/churn.txt
      $OUT/bin/$side/verdict-loadtest --verdictd $OUT/bin/$side/verdictd --policies 10000 --duration 3s --warmup 1s \
        --churn-rate $rate churn >> $OUT/churn.txt 2>&1
    done
  done
done
for round in 1 2; do
  echo "== workload-churn round $round $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/workload-churn.txt
  $OUT/bin/new/verdict-loadtest --verdictd $OUT/bin/new/verdictd --policies 10000 --workload-rate 1000 --duration 10s \
    --profile-dir $OUT/prof-$round workload-churn >> $OUT/workload-churn.txt 2>&1
  go tool pprof -top -cum -nodecount 40 $OUT/bin/new/verdictd $OUT/prof-$round/workload-churn.cpu.pprof >> $OUT/workload-churn.txt 2>&1
done
(cd $NEW/store/etcd && go test -run '^$' -bench 'BenchmarkPutVisible' -benchtime 500x) >> $OUT/putvisible.txt 2>&1
echo done
