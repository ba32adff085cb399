#!/bin/bash
# CPU time (task-clock, all threads) per op: T(N ops) - T(1 op), alternating sides; $1 tag, $2 rounds, sides in $SIDES
set -u
TAG=$1; R=${2:-2}; OUT=/work/ab-bp/out/cpu-$TAG.txt
SIDES=${SIDES:-old pre new}
clock() { # side bench n -> msec
  local side=$1 bench=$2 n=$3 dir
  case $side in old) dir=/work/wt/ab-old3;; pre) dir=/work/wt/ab-pre3;; new) dir=/work/wt/batchpath;; esac
  (cd $dir/server && perf stat -x, -e task-clock /work/ab-bp/$side/server.test -test.run '^$' -test.bench "$bench" -test.benchtime ${n}x 2>&1 >/dev/null | grep task-clock | cut -d, -f1)
}
for round in $(seq $R); do
  for side in $SIDES; do
    for spec in '^BenchmarkDecideBatch$/^DecideBatch$:400' '^BenchmarkDecideBatch$/^Empty$:400' '^BenchmarkRequestDecode$/^flow-decoder$:8000' '^BenchmarkDecide$/^Decide$:8000' '^BenchmarkDecide$/^Empty$:8000'; do
      b=${spec%:*}; n=${spec##*:}
      t1=$(clock $side "$b" 1); tn=$(clock $side "$b" $n)
      echo "$round $side $b $(python3 -c "print(f'{($tn-$t1)*1e6/($n-1):.0f}')") ns-cpu/op load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT
    done
  done
done
