#!/bin/bash
# Seventh session: main at afd7994 (fin4 binaries) against 3996fe6 (old; oldpp = its verdictd with /debug/pprof/profile).
set -u
OUT=$1; mkdir -p $OUT
OLD_ENG='BenchmarkDecide/policies=(1000|10000|100000)/scopes=(0|50)(/cached)?$|BenchmarkBuild|BenchmarkApplyOne|BenchmarkMemory'
NEW_ENG='BenchmarkDecide/sparse/FirstMatch/policies=(1000|10000|100000)/scopes=(0|50)/(nocache|cached)$|BenchmarkBuild|BenchmarkApplyOne|BenchmarkMemory'
SRV='BenchmarkDecide$|BenchmarkDecideBatch$|BenchmarkRequestDecode'
log() { echo "== $* $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $OUT/00-log.txt; }
log start main $(git -C /work/main rev-parse --short HEAD)
for round in 1 2 3 4; do
  log engine round $round
  (cd /work/ab-old/engine && /work/ab-bin/old/engine.test -test.run '^$' -test.bench "$OLD_ENG" -test.benchmem -test.benchtime 1s) >> $OUT/engine-old.txt 2>&1
  (cd /work/main/engine && /work/ab-bin/fin4/engine.test -test.run '^$' -test.bench "$NEW_ENG" -test.benchmem -test.benchtime 1s) >> $OUT/engine-new.txt 2>&1
done
for round in 1 2 3 4 5 6 7 8; do
  log applyone round $round
  (cd /work/ab-old/engine && /work/ab-bin/old/engine.test -test.run '^$' -test.bench 'BenchmarkApplyOne' -test.benchmem -test.benchtime 1s) >> $OUT/applyone-old.txt 2>&1
  (cd /work/main/engine && /work/ab-bin/fin4/engine.test -test.run '^$' -test.bench 'BenchmarkApplyOne' -test.benchmem -test.benchtime 1s) >> $OUT/applyone-new.txt 2>&1
done
for round in 1 2; do
  log server round $round
  (cd /work/ab-old/server && /work/ab-bin/old/server.test -test.run '^$' -test.bench "$SRV" -test.benchmem -test.benchtime 1s) >> $OUT/server-old.txt 2>&1
  (cd /work/main/server && /work/ab-bin/fin4/server.test -test.run '^$' -test.bench "$SRV" -test.benchmem -test.benchtime 1s) >> $OUT/server-new.txt 2>&1
done
for round in 1 2 3; do
  for side in oldpp fin4; do
    log loadtest round $round $side
    /work/ab-bin/fin4/verdict-loadtest --verdictd /work/ab-bin/$side/verdictd --policies 10000 --duration 3s --warmup 1s --profile-dir $OUT/prof-$side-$round >> $OUT/loadtest-$side.txt 2>&1
  done
done
log done
