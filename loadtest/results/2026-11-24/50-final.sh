#!/bin/bash
# End-of-session quiet measurements: issue 11's A/B against 3996fe6, then issue 13's profiles.
set -u
OUT=$1; mkdir -p $OUT
cd /work/main
echo "== $(date +%T) main $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee $OUT/00-uptime.txt
sed -e 's#^NEW_ENG=.*#NEW_ENG='"'"'BenchmarkDecide/(sparse|dense)/FirstMatch/policies=(1000|10000|100000)/scopes=(0|50)/(nocache|cached)$|BenchmarkBuild|BenchmarkApplyOne|BenchmarkMemory'"'"'#' loadtest/results/2026-11-24/29-ab.sh > /tmp/ab.sh
rm -rf /work/ab-bin/out /work/ab-bin/new; mkdir -p /work/ab-bin/new
bash /tmp/ab.sh
for f in engine server loadtest; do for s in old new; do cp /work/ab-bin/out/$f-$s.txt $OUT/50-ab-3996fe6-$f-$s.txt; done; done
echo "ab done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/00-uptime.txt
B=/work/ab-bin/new
mkdir -p $OUT/prof
$B/verdict-loadtest --verdictd $B/verdictd --policies 10000 --duration 5s --warmup 1s --batch-size 1000 --profile-dir $OUT/prof --cpuprofile $OUT/prof/loadtest-compact1000.pprof compact compact-stream > $OUT/51-lt-compact1000-profiled.txt 2>&1
$B/verdict-loadtest --verdictd $B/verdictd --policies 10000 --workload-rate 1000 --churn-rate 1000 --duration 10s --profile-dir $OUT/prof workload-churn > $OUT/52-workload-churn-decide1k-profiled.txt 2>&1
$B/verdict-loadtest --verdictd $B/verdictd --policies 10000 --workload-rate 1000 --duration 10s --profile-dir $OUT/prof/10k workload-churn > $OUT/52-workload-churn-profiled.txt 2>&1
$B/verdict-loadtest --verdictd $B/verdictd --policies 10000 --workload-rate 1000 --churn-rate 1000 --duration 10s --etcd-tmpdir /dev/shm workload-churn > $OUT/53-workload-churn-decide1k-shm.txt 2>&1
echo "== done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/00-uptime.txt
