"""Multi-node nccl-tests tables: every real table parses, with its node count, GPUs per node and
layout read from its own header (skips when ../shared/data is absent)."""

import re

import pytest

from zsim.trace.nccl_tests import checked, header_of, read_nccl_tests

# GPUs per node of each cluster, from its SOURCE.md (hardware as the folder's provenance states it).
GPUS_PER_NODE = {"abci-v100-ib-edr": 4, "alps-gh200-slingshot-default": 4, "alps-gh200-slingshot-fi-cxi-tuned": 4,
                 "aws-p4d-a100-efa-nccl2-8-3": 8, "aws-p4d-a100-efa-nccl2-9-9": 8, "gcp-a3mega-h100-tcpxo": 8,
                 "gcp-a4-b200-roce": 8, "issue309-dell-xe9680-h100-ib-ndr400": 8,
                 "issue309-gjaion-h100-ib-ndr400-default": 8, "issue309-gjaion-h100-ib-ndr400-minctas24-qps2": 8,
                 "issue309-gjaion-h100-ib-ndr400-ring-minctas24-qps2": 8, "oci-a100-sxm4-40gb-roce": 8,
                 "oci-bm-gpu-b4-8-a100-roce-partial": 8}
OLD_LAYOUT = {"abci-v100-ib-edr", "aws-p4d-a100-efa-nccl2-8-3", "aws-p4d-a100-efa-nccl2-9-9"}  # SOURCE.md says so


def multinode_tables(root):
    return sorted(p for p in (root / "nccl-tests").glob("*/*-*nodes.txt"))


def test_every_multinode_table_parses_with_its_node_count(shared_data):
    tables = multinode_tables(shared_data)
    assert len(tables) == 38  # the data README: 38 multi-node tables from 8 clusters (1-node Alps included)
    for path in tables:
        header = header_of(path)
        nodes = int(re.search(r"-(\d+)nodes", path.name).group(1))
        assert header is not None, path
        assert header.nodes == nodes, path
        assert header.gpus_per_node == GPUS_PER_NODE[path.parent.name], path
        assert header.gpus_per_process == 1, path
        assert header.layout == ("old" if path.parent.name in OLD_LAYOUT else "new"), path
        rows = read_nccl_tests(path)
        assert len(rows) >= 4 and all(r.time_us > 0 for r in rows), path
        # busbw = algbw × 2(n-1)/n for all_reduce, (n-1)/n for all_gather (nccl-tests PERFORMANCE.md)
        factor = 2 if path.name.startswith("all_reduce") else 1
        big = [r for r in rows if r.algbw >= 1.0]
        assert all(r.busbw == pytest.approx(r.algbw * factor * (header.ranks - 1) / header.ranks, rel=0.02, abs=0.02)
                   for r in big), path


def test_old_layout_reads_the_out_of_place_columns(shared_data):
    """ABCI (nccl-tests 0b30de5): no root column, an `error` column; the 32 MiB row as printed."""
    rows = read_nccl_tests(shared_data / "nccl-tests/abci-v100-ib-edr/all_reduce-32nodes.txt")
    assert len(rows) == 24 and rows[-1].size == 33554432 and rows[-1].busbw == pytest.approx(13.23)


def test_partial_rank_lines_give_every_rank_and_node(shared_data):
    """OCI's partial log lists ranks 0, 7, 8 and 15 only: 16 ranks on 2 nodes of 8."""
    header = header_of(shared_data / "nccl-tests/oci-bm-gpu-b4-8-a100-roce-partial/all_reduce-2nodes.txt")
    assert (header.ranks, header.nodes, header.gpus_per_node) == (16, 2, 8)


def test_header_counts_hosts(tmp_path):
    table = tmp_path / "all_reduce.txt"
    lines = [f"#  Rank {r:2d} Pid 1 on host{r // 3} device {r % 3} [0x1] GPU" for r in range(9)]
    table.write_text("# nThread 1 nGpus 1\n" + "\n".join(lines) + "\n")
    header = header_of(table)
    assert (header.ranks, header.nodes, header.gpus_per_node, header.layout) == (9, 3, 3, "new")
    table.write_text("\n".join(lines[:4]) + "\n")  # ranks 0..3 on 2 hosts: uneven
    with pytest.raises(Exception, match="do not split evenly"):
        header_of(table)


def test_rows_whose_own_check_failed_are_left_out_of_the_fits(shared_data):
    """The four rows SOURCE.md flags as DOUBTFUL (Out of bounds values ... FAILED) carry their #wrong count,
    and `checked` (every fit's and held-out error's filter) leaves exactly those out."""
    from zsim.calibrate.net_fit import read_runs
    from zsim.trace.nccl_tests import checked

    folder = shared_data / "nccl-tests/alps-gh200-slingshot-default"
    flagged = {(p.name, r.size, r.wrong) for p in sorted(folder.glob("*nodes.txt"))
               for r in checked(read_nccl_tests(p))[1]}
    assert flagged == {("all_reduce-8nodes.txt", 33554432, 288), ("all_reduce-16nodes.txt", 67108864, 2752),
                       ("all_reduce-256nodes.txt", 1048576, 20736), ("all_reduce-512nodes.txt", 1048576, 36864)}
    runs = {r.path.name: r for r in read_runs(folder)}
    assert [r.size for r in runs["all_reduce-8nodes.txt"].failed] == [33554432]
    assert 33554432 not in {r.size for r in runs["all_reduce-8nodes.txt"].rows}
    others = [p for p in multinode_tables(shared_data) if p.parent.name != folder.name]
    assert not any(checked(read_nccl_tests(p))[1] for p in others)  # no other table flags a row


def test_a_wrong_count_is_read_from_its_column(tmp_path):
    table = tmp_path / "all_reduce-2nodes.txt"
    head = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n")
    table.write_text(head + "     1048576        262144     float     sum      -1    100.0   10.49   19.66      0    100.0   10.49   19.66      0\n"
                            "     2097152        524288     float     sum      -1   9000.0    0.23    0.44     17    200.0   10.49   19.66    N/A\n")
    ok, bad = checked(read_nccl_tests(table))
    assert [r.size for r in ok] == [1048576] and [(r.size, r.wrong) for r in bad] == [(2097152, 17)]


def test_single_node_tables_name_the_rows_they_leave_out(tmp_path):
    """zsim nccl-fit's single-node reader drops a row whose check failed and names it for the output."""
    from zsim.commands.nccl_fit import read_tables

    head = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n")
    (tmp_path / "all_reduce.txt").write_text(
        head + "     1048576        262144     float     sum      -1    100.0   10.49   19.66      0    100.0   10.49   19.66      0\n"
               "     2097152        524288     float     sum      -1   9000.0    0.23    0.44     17    200.0   10.49   19.66      0\n")
    failed: list[str] = []
    tables = read_tables(tmp_path, failed)
    assert [r.size for r in tables["all_reduce"]] == [1048576]
    assert failed == ["all_reduce.txt 2097152 B (17 wrong)"]
