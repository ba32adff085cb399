#!/bin/bash
# Extra rounds for the engine's Decide and one change: 3996fe6 (old) vs main (new), alternated.
OUT=$1; mkdir -p $OUT
OLD='BenchmarkDecide/policies=(1000|10000|100000)/scopes=(0|50)(/cached)?$|BenchmarkApplyOne'
NEW='BenchmarkDecide/sparse/FirstMatch/policies=(1000|10000|100000)/scopes=(0|50)/(nocache|cached)$|BenchmarkApplyOne'
for round in 1 2 3 4; do
  (cd /work/ab-old/engine && /work/ab-bin/old/engine.test -test.run '^$' -test.bench "$OLD" -test.benchmem -test.benchtime 1s) >> $OUT/engine-old.txt 2>&1
  (cd /work/main/engine && /work/ab-bin/new/engine.test -test.run '^$' -test.bench "$NEW" -test.benchmem -test.benchtime 1s) >> $OUT/engine-new.txt 2>&1
  echo "round $round $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/uptime.txt
done
