#!/bin/bash
# usage: ab1.sh ROUNDS name=binary ... ; runs BenchmarkApplyOne alternated; old runs in /work/ab-old/engine
R=$1; shift
for r in $(seq 1 $R); do
  for nb in "$@"; do
    n=${nb%%=*}; b=${nb#*=}
    d=/work/wt/lead/engine; [ "$n" = old ] && d=/work/ab-old/engine
    (cd $d && $b -test.run '^$' -test.bench 'BenchmarkApplyOne' -test.benchmem 2>&1 | grep Bench | sed "s/^/$n /")
  done
done
