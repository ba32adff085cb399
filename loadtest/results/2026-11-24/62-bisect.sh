#!/bin/bash
# usage: bisect.sh OUTDIR ROUNDS bin1 bin2 ...
out=$1; rounds=$2; shift 2
mkdir -p $out
for r in $(seq 1 $rounds); do
  for b in "$@"; do
    B=/work/ab-bin/$b
    $B/verdict-loadtest --verdictd $B/verdictd --policies 10000 --duration 3s --warmup 1s unary >> $out/$b.txt 2>&1
  done
done
for b in "$@"; do echo "$b: $(grep -o 'ratio [0-9.]*' $out/$b.txt | awk '{print $2}' | sort -n | tr '\n' ' ')"; done
