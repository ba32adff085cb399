#!/bin/bash
# verdictd CPU per 1000 decisions, new load tester driving either side's verdictd; $1 tag $2 rounds $3 scenario
set -u
TAG=$1; R=${2:-2}; SC=${3:-batch}; OUT=/work/ab-bp/out/cpult-$TAG.txt; PORT=17099
sample() { # prints cpu decisions every 0.25s until killed
  while true; do
    m=$(curl -s --max-time 1 http://127.0.0.1:$PORT/metrics 2>/dev/null)
    if [ -n "$m" ]; then
      cpu=$(echo "$m" | awk '/^process_cpu_seconds_total/ {print $2}')
      dec=$(echo "$m" | awk '/^verdict_decisions_total/ {s+=$2} END {print s+0}')
      echo "$cpu $dec"
    fi
    sleep 0.25
  done
}
for round in $(seq $R); do
  for side in old new; do
    sample > /tmp/bp-samples.txt & SP=$!
    res=$(/work/ab-bp/new/verdict-loadtest --verdictd /work/ab-bp/$side/verdictd --verdictd-metrics 127.0.0.1:$PORT --policies 10000 --duration 3s --warmup 1s $SC 2>&1 | grep ratio | tr -s ' ')
    kill $SP; wait $SP 2>/dev/null
    per=$(awk 'NR>1 && $2>pd && pc!="" {dc+=$1-pc; dd+=$2-pd} {pc=$1; pd=$2} END {if (dd>0) printf "%.1f", dc/dd*1e6*1000; else print "n/a"}' /tmp/bp-samples.txt)
    echo "$round $side $SC verdictd_us_per_1000_decisions=$per ($res) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT
  done
done
