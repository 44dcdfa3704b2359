#!/usr/bin/env python3
"""Parse DeepGEMM README performance tables (H800) into CSV.
usage: parse_deepgemm.py MIRROR_GIT_DIR OUT_EARLIEST OUT_ALLVERSIONS"""
import re, subprocess, sys
repo, out1, out2 = sys.argv[1:4]
# README versions that carry the table (3 distinct tables); first commit of each
VERS = [('v1', 'a6d97a1c1b48a7a9d7994d0e155ee6f11d0a3f07'),
        ('v2', '55ab91f72f76e8a6db0e86282c3169a88d93df1b'),
        ('v3', 'a9967bc27cdcead54e8d11e1736644eb51d49b33')]
KIND = {'Normal GEMMs for dense models': 'dense',
        'Grouped GEMMs for MoE models (contiguous layout)': 'grouped contiguous',
        'Grouped GEMMs for MoE models (masked layout)': 'grouped masked'}
HDR = 'm,n,k,deepgemm_tflops,speedup,cutlass_tflops,kind,groups,m_per_group,mem_bw_gbs,time_us_derived,commit,readme_line'
def parse(commit):
    txt = subprocess.run(['git', '--git-dir', repo, 'show', f'{commit}:README.md'], capture_output=True, text=True, check=True).stdout
    kind = None; rows = []
    for i, ln in enumerate(txt.split('\n'), 1):
        m = re.match(r'### (.*)$', ln)
        if m: kind = KIND.get(m.group(1).strip()); continue
        if kind and re.match(r'^\|\s*\d', ln):
            c = [x.strip() for x in ln.strip().strip('|').split('|')]
            if kind == 'dense': g, mpg, n, k = 1, int(c[0]), int(c[1]), int(c[2]); rest = c[3:]
            else: g, mpg, n, k = int(c[0]), int(c[1]), int(c[2]), int(c[3]); rest = c[4:]
            tf = float(rest[0].split()[0]); bw = float(rest[1].split()[0]); sp = float(rest[2].rstrip('x'))
            M = g * mpg
            t_us = 2 * M * n * k / (tf * 1e12) * 1e6
            rows.append(f'{M},{n},{k},{tf:g},{sp:g},{tf/sp:.1f},{kind},{g},{mpg},{bw:g},{t_us:.2f},{commit},{i}')
    return rows
allrows = []
for tag, c in VERS:
    r = parse(c); print(tag, c, len(r), 'rows'); allrows += [(tag, x) for x in r]
with open(out1, 'w') as f:
    f.write(HDR + '\n'); f.writelines(x + '\n' for t, x in allrows if t == 'v1')
with open(out2, 'w') as f:
    f.write('version,' + HDR + '\n'); f.writelines(f'{t},{x}\n' for t, x in allrows)
