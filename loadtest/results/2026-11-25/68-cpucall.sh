#!/bin/bash
# usage: cpucall.sh OUTDIR ROUNDS bin...   verdictd CPU per unary Decide (profile total samples ÷ calls)
out=$1; rounds=$2; shift 2; mkdir -p $out
for r in $(seq 1 $rounds); do for b in "$@"; do
  B=/work/ab-bin/$b; d=$out/$b-$r; mkdir -p $d
  ${LT:-$B/verdict-loadtest} --verdictd $B/verdictd --policies 10000 --duration 3s --warmup 1s --profile-dir $d ${SCEN:-unary} > $d/out.txt 2>&1
  calls=$(awk -v s="${SCEN:-unary} — verdict" '$0 ~ s{f=1} f&&/count/{print $2; exit}' $d/out.txt)
  tot=$(go tool pprof -top $B/verdictd $d/${SCEN:-unary}.cpu.pprof 2>/dev/null | grep -o 'Total samples = [0-9.]*m\?s' | head -1)
  ratio=$(grep -o 'ratio [0-9.]*' $d/out.txt | awk '{print $2}')
  echo "$b round $r calls $calls $tot ratio $ratio" | tee -a $out/summary.txt
done; done

