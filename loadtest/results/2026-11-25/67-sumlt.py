import re,sys,subprocess,statistics as st,os
# usage: sumlt.py DIR side...  ; reads DIR/loadtest-SIDE.txt and DIR/prof-SIDE-N/*.cpu.pprof
d=sys.argv[1]
def total(p):
    out=subprocess.run(['go','tool','pprof','-top','-nodecount=1',p],capture_output=True,text=True).stdout
    m=re.search(r'Total samples = ([\d.]+)(m?)s',out)
    return float(m.group(1))/(1000 if m.group(2) else 1) if m else float('nan')
for side in sys.argv[2:]:
    txt=open(f'{d}/loadtest-{side}.txt').read()
    rounds=txt.split('verdict-loadtest: ')[1:]
    res={}
    for i,r in enumerate(rounds,1):
        for sc in ['unary','batch','stream']:
            m=re.search(sc+r' — verdict.*?\n  count (\d+) in [\d.]+s.*?\n(?:.*\n)?  vs empty handler.*ratio ([\d.]+)',r)
            if not m: continue
            n=int(m.group(1)); ratio=float(m.group(2))
            if sc=='batch': n*=100
            cpu=total(f'{d}/prof-{side}-{i}/{sc}.cpu.pprof')
            res.setdefault(sc,[]).append((ratio, cpu*1e6/n))
        m=re.search(r'churn — verdict.*?write → visible: p50 \S+\s+p99 ([\d.]+)(ms|µs)',r,re.S)
        if m: res.setdefault('churn p99 ms',[]).append((float(m.group(1))/(1000 if m.group(2)=='µs' else 1),0))
        m=re.search(r'fanout — verdict.*?write → delivered: p50 \S+\s+p99 ([\d.]+)(ms|s)',r,re.S)
        if m: res.setdefault('fanout p99 ms',[]).append((float(m.group(1))*(1000 if m.group(2)=='s' else 1),0))
    for k,v in res.items():
        a=[x for x,_ in v]; b=[y for _,y in v]
        print(f"{side:6s} {k:14s} " + ' '.join(f'{x:.2f}' for x in a) + f" median {st.median(a):.2f}" + (f" | CPU µs/decision " + ' '.join(f'{y:.1f}' for y in b) + f" median {st.median(b):.1f}" if b[0] else ''))
