#!/usr/bin/env python3
"""Parse tile-ai/tilelang benchmark/matmul_fp8/README.md results tables (H800 SXM, M=N=8192) at two commits."""
import re, subprocess, sys
repo, out = sys.argv[1:3]
P = 'benchmark/matmul_fp8/README.md'
VERS = [('v1', 'fb8b3afa0a222d4a93ac2497d104769d4156dae9'), ('v2', '6d766a962a914564a2be8ca2faf2a8832f0a39c5')]
with open(out, 'w') as f:
    f.write('version,m,n,k,dtype,latency_ms,tflops_readme,tflops_recomputed,commit,readme_line\n')
    for tag, c in VERS:
        txt = subprocess.run(['git', '--git-dir', repo, 'show', f'{c}:{P}'], capture_output=True, text=True, check=True).stdout
        for i, ln in enumerate(txt.split('\n'), 1):
            m = re.match(r'^\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|', ln)
            if m:
                k, lat, tf = int(m.group(1)), float(m.group(2)), float(m.group(3))
                rec = 2 * 8192 * 8192 * k / (lat * 1e-3) / 1e12
                f.write(f'{tag},8192,8192,{k},f8e4m3fnxf8e4m3fn->f8e4m3fn,{lat},{tf:g},{rec:.1f},{c},{i}\n')
