#!/usr/bin/env python3
"""Parse XLA matmul_interpolator_data.h (textproto in a C++ raw string) into CSVs.
usage: parse_xla.py FILE OUTDIR
Writes xla-<gpu>-fp8.csv (FP8 dtype keys only) and xla-<gpu>-all.csv (all dtypes) per GPU key."""
import re, sys, collections
src, outdir = sys.argv[1], sys.argv[2]
txt = open(src).read()
lines = txt.split('\n')
gpu = None; cur = {}; rows = collections.defaultdict(list); meta = {}
for i, ln in enumerate(lines, 1):
    s = ln.strip()
    m = re.match(r'key: "(\w+)"$', s)
    if m:
        gpu = m.group(1); meta.setdefault(gpu, [i, i]); continue
    m = re.match(r'([bmnk]): (\d+)$', s)
    if m:
        cur[m.group(1)] = int(m.group(2)); continue
    m = re.match(r'flops \{ key: "([^"]+)" value: (\d+) \}$', s)
    if m:
        rows[gpu].append((cur['b'], cur['m'], cur['n'], cur['k'], m.group(1), int(m.group(2)), i))
        meta[gpu][1] = i
for g, rs in rows.items():
    cnt = collections.Counter(r[4] for r in rs)
    print(g, 'lines', meta[g], dict(cnt))
    for tag, pred in (('fp8', lambda d: 'f8' in d), ('all', lambda d: True)):
        with open(f'{outdir}/xla-{g}-{tag}.csv', 'w') as f:
            f.write('b,m,n,k,dtype,flops_per_s,tflops\n')
            for b, m_, n, k, d, fl, _ in rs:
                if pred(d):
                    f.write(f'{b},{m_},{n},{k},{d},{fl},{fl/1e12:.4f}\n')
