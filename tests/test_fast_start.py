"""What keeps `zsim run` fast (benchmarks/bench_start.py measures it): the flagship's own process
imports neither networkx (class mode needs no graph), nor matplotlib (the plot is drawn after the
summary, by another process), nor numpy (the outputs are written from plain lists), and its trace
lists process groups once, not per event."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_flagship_process_imports_no_graph_or_plot_library(tmp_path):
    code = ("import sys; from zsim.cli import main; "
            f"code = main(['run', '1T-1024gpu', '-o', {str(tmp_path)!r}, '--json', {str(tmp_path / 'r.json')!r}]); "
            "print(code, *(m in sys.modules for m in ('networkx', 'matplotlib', 'numpy')), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.stderr.strip().splitlines()[-1] == "0 False False False", proc.stderr
    trace = json.loads((tmp_path / "trace.json").read_text())
    groups = [e["args"]["group"] for e in trace["traceEvents"] if e.get("ph") == "X" and "group" in e["args"]]
    assert groups and set(groups) == {"dp", "mp"}
    assert len(trace["metadata"]["groups"]["dp"]) == 64 and len(trace["metadata"]["groups"]["mp"]) == 16
