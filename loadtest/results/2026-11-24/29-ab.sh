#!/bin/bash
# Same-run A/B of make bench's engine and server benchmarks and make loadtest: 3996fe6 (old) vs main (new).
# Rounds alternate old/new so both see the same machine. Output: /work/ab-bin/out/
set -u
OUT=/work/ab-bin/out; mkdir -p $OUT
cd /work/ab-old && go test -c -o /work/ab-bin/old/engine.test ./engine/ && go test -c -o /work/ab-bin/old/server.test ./server/ || exit 1
cd /work/main && go test -c -o /work/ab-bin/new/engine.test ./engine/ && go test -c -o /work/ab-bin/new/server.test ./server/ && go build -o /work/ab-bin/new/ ./cmd/verdictd ./cmd/verdict-loadtest || exit 1
OLD_ENG='BenchmarkDecide/policies=(1000|10000|100000)/scopes=(0|50)(/cached)?$|BenchmarkBuild|BenchmarkApplyOne|BenchmarkMemory'
NEW_ENG='BenchmarkDecide/sparse/FirstMatch/policies=(1000|10000|100000)/scopes=(0|50)/(nocache|cached)$|BenchmarkBuild|BenchmarkApplyOne|BenchmarkMemory'
SRV='BenchmarkDecide$|BenchmarkDecideBatch$|BenchmarkRequestDecode'
for round in 1 2; do
  for side in old new; do
    pat=$OLD_ENG; dir=/work/ab-old; [ $side = new ] && pat=$NEW_ENG && dir=/work/main
    (cd $dir/engine && /work/ab-bin/$side/engine.test -test.run '^$' -test.bench "$pat" -test.benchmem -test.benchtime 1s) >> $OUT/engine-$side.txt 2>&1
    (cd $dir/server && /work/ab-bin/$side/server.test -test.run '^$' -test.bench "$SRV" -test.benchmem -test.benchtime 1s) >> $OUT/server-$side.txt 2>&1
  done
done
for round in 1 2; do
  for side in old new; do
    echo "== round $round $side $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/loadtest-$side.txt
    /work/ab-bin/$side/verdict-loadtest --verdictd /work/ab-bin/$side/verdictd --policies 10000 --duration 3s --warmup 1s >> $OUT/loadtest-$side.txt 2>&1
  done
done
echo done
