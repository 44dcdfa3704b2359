"""Inter-node terms: the 2-node tree, the latency regime at thousands of ranks, the multi-node fit
recovering known terms, `zsim collective` output read back as input, and what `zsim run` says."""

import dataclasses
import json

import pytest

from zsim.calibrate.net_fit import error_summary, fit_network, read_runs, with_network
from zsim.cli import main
from zsim.commands.collective import collective_table
from zsim.fabric.cluster import load_cluster
from zsim.fabric.perf import run_collective
from zsim.report.network import network_facts
from zsim.trace.nccl_tests import header_of, read_nccl_tests


def test_two_node_tree_beats_the_nic_line_rate_and_more_nodes_do_not():
    """Alps: 4 NICs of 200 Gb/s = 100 GB/s a node. On 2 nodes the tree's NICs carry S, not 2S, so
    all_reduce busbw may exceed the line rate (measured: 158 GB/s); from 4 nodes on it may not (92)."""
    line = 4 * 200 / 8
    two = run_collective(load_cluster("alps-gh200", 2), "all_reduce", 1 << 32, 8, simulate=False)
    four = run_collective(load_cluster("alps-gh200", 4), "all_reduce", 1 << 32, 16, simulate=False)
    assert two.algorithm.startswith("tree") and two.busbw > line
    assert four.busbw < line


def test_kilobyte_shards_at_a_thousand_ranks_are_latency_bound():
    """ZeRO-3's all_gather of 4 KiB per rank over 1024 GPUs (64 DGX-2 nodes): the time is the ring's
    steps, so doubling the bytes barely moves it and busbw is far below the NICs'."""
    cluster = load_cluster("dgx2", 64)
    small = run_collective(cluster, "all_gather", 4096 * 1024, 1024, simulate=False)
    double = run_collective(cluster, "all_gather", 2 * 4096 * 1024, 1024, simulate=False)
    assert double.time_us < 1.3 * small.time_us
    assert small.busbw < 0.2 * cluster.nics_per_node * cluster.nic_bytes_per_s / 1e9
    assert small.time_us > 63 * cluster.network_step_s(64, "ring", "LL") * 1e6  # at least the 63 crossings


def test_step_latency_grows_with_nodes_by_the_fitted_term():
    c = with_network(load_cluster("dgx2", 2), {"latency_us": 10.0, "latency_growth_us": 3.0})
    assert c.network_step_s(2) == pytest.approx(10e-6)
    assert c.network_step_s(64) == pytest.approx(10e-6 + 5 * 3e-6)
    assert c.network_step_s(2, "ring", "LL") < c.network_step_s(2)  # NCCL's ratios: LL steps are cheaper


def write_tables(folder, profile, nodes_list, per_node, values=None, as_json=False):
    """zsim collective's own output for `profile` (with inter-node `values`), one table per node count."""
    folder.mkdir(exist_ok=True)
    for nodes in nodes_list:
        args = ["collective", "--profile", profile, "--nodes", str(nodes), "--gpus", str(nodes * per_node),
                "--op", "all_reduce", "-b", "8", "-e", "64M"]
        path = folder / f"all_reduce-{nodes}nodes.{'json' if as_json else 'txt'}"
        if as_json:
            assert main(args + ["--json", str(path)]) == 0
        else:
            import contextlib
            import io
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(args) == 0
            path.write_text(out.getvalue())


@pytest.mark.parametrize("as_json", [False, True])
def test_collective_output_reads_back_as_the_run_it_simulates(tmp_path, capsys, as_json):
    write_tables(tmp_path, "abci-v100", [4], 4, as_json=as_json)
    capsys.readouterr()
    path = tmp_path / f"all_reduce-4nodes.{'json' if as_json else 'txt'}"
    header = header_of(path)
    assert (header.ranks, header.nodes, header.gpus_per_process) == (16, 4, 1)
    rows = read_nccl_tests(path)
    expected = collective_table("abci-v100", 4, 16, "all_reduce", [r.size for r in rows])
    assert [r.size for r in rows] == [e.size for e in expected]
    assert [r.time_us for r in rows] == pytest.approx([e.time_us for e in expected], rel=1e-3, abs=0.01)


def test_the_fit_recovers_the_terms_that_made_the_tables(tmp_path, capsys):
    """Tables simulated with the shipped EDR terms, fitted from a neutral start, give them back."""
    write_tables(tmp_path, "abci-v100", [2, 4, 8], 4)
    capsys.readouterr()
    result = fit_network("abci-v100", read_runs(tmp_path))
    net = load_cluster("abci-v100", 2)
    assert result.values["efficiency"] == pytest.approx(net.network_efficiency, rel=0.01)
    assert result.values["latency_us"] == pytest.approx(net.nic_pool.latency_s * 1e6, rel=0.05)
    assert error_summary(result.residuals)[1] < 0.01  # rows >= 1 MiB (smaller ones print busbw 0.00-0.99)


def test_tables_run_as_rings_are_simulated_as_rings_and_hold_the_tree_term(tmp_path, capsys):
    """A table NCCL ran with NCCL_ALGO=RING (p4d's, SOURCE.md) is priced as a ring whatever the tuner
    would pick, and a fit that sees no tree row cannot fit the tree's share: it keeps the profile's."""
    write_tables(tmp_path, "abci-v100", [8], 4)
    capsys.readouterr()
    runs = read_runs(tmp_path, algorithm="ring")
    result = fit_network("abci-v100", runs)
    assert {r.algorithm.split("/")[0] for r in result.residuals} == {"ring"}
    assert "tree_efficiency" not in result.fitted
    assert result.values["tree_efficiency"] == load_cluster("abci-v100", 8).tree_efficiency
    assert "tree" in {r.algorithm.split("/")[0] for r in fit_network("abci-v100", read_runs(tmp_path)).residuals}


def test_nccl_fit_prints_a_network_section_for_multinode_tables(tmp_path, capsys):
    write_tables(tmp_path, "abci-v100", [2, 4], 4)
    capsys.readouterr()
    assert main(["nccl-fit", str(tmp_path), "--profile", "abci-v100", "--max-nodes", "2", "--json", "-"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out[out.index("{"):])
    assert data["nodes"] == [2, 2] and set(data["summary"]) == {"fit", "held"}
    assert "latency_growth_us" not in data["values"] or data["values"]["latency_growth_us"] == 0.0


def test_run_says_what_its_inter_node_terms_rest_on():
    assert network_facts(load_cluster("dgx2", 1))["status"] == "single node"
    inside = network_facts(load_cluster("dgx2", 8))
    assert inside["status"] == "fitted" and "ABCI" in inside["line"] and "within the fit" in inside["line"]
    beyond = network_facts(load_cluster("dgx2", 64))
    assert beyond["status"] == "extrapolated" and "64 nodes: extrapolated" in beyond["line"]
    overridden = network_facts(load_cluster("dgx2", 8, nic_Gbps=200.0))
    assert overridden["status"] == "assumed"
    hdr = network_facts(dataclasses.replace(load_cluster("dgx-a100", 4)))
    assert hdr["status"] == "assumed"  # ib-hdr: no HDR cluster in the data, terms carried over from EDR
    # NCCL's LL ceiling across nodes: from the 2.8 tuner on (hgx-h100-ndr runs 2.23), none for 2.5 (dgx2) or 2.7
    assert network_facts(load_cluster("hgx-h100-ndr", 2))["ll_ceiling_GBps"] == 39.0
    assert network_facts(load_cluster("hgx-h100-ndr", 4))["ll_ceiling_GBps"] == 20.4
    assert inside["ll_ceiling_GBps"] is None and hdr["ll_ceiling_GBps"] is None


def test_flagship_summary_names_its_network(tmp_path, capsys):
    assert main(["run", "scenarios/1T-1024gpu.yaml", "--no-plot", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.strip().startswith("network"))
    assert "fitted on ABCI" in line and "64 nodes: extrapolated" in line
    facts = json.loads((tmp_path / "result.json").read_text())
    assert facts["inter_node"]["status"] == "extrapolated" and facts["inter_node"]["fit_nodes"] == [2, 32]


def test_calibrate_writes_the_fitted_network_beside_the_profile(tmp_path, capsys):
    """`zsim calibrate` on a folder of multi-node tables fits the inter-node terms and writes them as
    networks/<stem>-net.yaml, which the written system profile names and loads."""
    write_tables(tmp_path / "tables", "abci-v100", [2, 4], 4)
    capsys.readouterr()
    out = tmp_path / "cal" / "mine.yaml"
    assert main(["calibrate", str(tmp_path / "tables"), "--profile", "abci-v100", "-o", str(out)]) == 0
    assert "network" in capsys.readouterr().out
    assert (tmp_path / "cal" / "networks" / "mine-net.yaml").is_file()
    from zsim.config.profiles import Profiles

    profiles, name = Profiles().resolve_system(str(out))
    cluster = load_cluster(name, 4, profiles)
    shipped = load_cluster("abci-v100", 4)
    assert cluster.network_profile == "mine-net" and cluster.network_fit.nodes == [2, 4]
    assert cluster.network_efficiency == pytest.approx(shipped.network_efficiency, rel=0.01)


def test_a_large_simulated_table_lists_each_node_once(tmp_path, capsys):
    """Beyond 64 GPUs the header lists each node's first rank and the last: 33 lines for 32 nodes."""
    args = ["collective", "--profile", "alps-gh200", "--nodes", "32", "--gpus", "128", "--op", "all_reduce",
            "-b", "1M", "-e", "1M"]
    assert main(args) == 0
    path = tmp_path / "all_reduce-32nodes.txt"
    path.write_text(capsys.readouterr().out)
    assert path.read_text().count("#  Rank") == 33
    header = header_of(path)
    assert (header.ranks, header.nodes, header.gpus_per_node) == (128, 32, 4)


def test_nccl_fit_holds_a_term_where_asked(tmp_path, capsys):
    """`--hold efficiency=V` keeps that term out of the fit (ib-edr's way: ABCI's tables stop at 32 MiB):
    the fit returns V, lists the term as held and fits the rest."""
    write_tables(tmp_path, "abci-v100", [2, 4], 4)
    capsys.readouterr()
    assert main(["nccl-fit", str(tmp_path), "--profile", "abci-v100", "--hold", "efficiency=0.5", "--json", "-"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out[captured.out.index("{"):])
    assert data["values"]["efficiency"] == 0.5
    text = captured.err
    assert "held: {efficiency: given by --hold}" in text
    terms = next(line for line in text.splitlines() if line.strip().startswith("terms:"))
    assert "efficiency" not in terms.replace("tree_efficiency", "") and "latency_us" in terms


@pytest.mark.parametrize("hold", ["efficiency=2", "efficiency=nan", "efficiency=x", "speed=1", "efficiency"])
def test_nccl_fit_refuses_a_bad_hold(tmp_path, capsys, hold):
    write_tables(tmp_path, "abci-v100", [2], 4)
    capsys.readouterr()
    assert main(["nccl-fit", str(tmp_path), "--profile", "abci-v100", "--hold", hold]) == 2
    assert "--hold" in capsys.readouterr().err


def test_a_hold_on_single_node_tables_is_refused(tmp_path, capsys):
    (tmp_path / "all_reduce.txt").write_text("# nothing\n")
    assert main(["nccl-fit", str(tmp_path), "--profile", "dgx2", "--gpus", "16", "--hold", "efficiency=0.9"]) == 2
    assert "holds an inter-node term" in capsys.readouterr().err


def test_infiniband_efficiency_is_the_published_share_and_says_so():
    """ib-edr holds `efficiency` at NCCL's published share (not fitted: ABCI's tables stop at 32 MiB) and names
    its source; ib-hdr takes the same figure; a run's network line says the term was held, not fitted."""
    from zsim.calibrate.net_terms import IB_EFFICIENCY

    edr = load_cluster("dgx2", 64)
    assert edr.network_efficiency == IB_EFFICIENCY == 0.96
    assert "efficiency" not in edr.network_fit.terms and "nccl-tests/issues/29" in edr.network_fit.held["efficiency"]
    assert load_cluster("dgx-a100", 4).network_efficiency == IB_EFFICIENCY
    facts = network_facts(edr)
    assert list(facts["held_terms"]) == ["efficiency"] and "efficiency held at published figures" in facts["line"]
    # ABCI's 8-node ring at 2 GiB: 0.96 of its two EDR NICs' 25 GB/s (docs/fabric.md)
    rows = collective_table("abci-v100", 8, 32, "all_reduce", [1 << 31])
    assert rows[0].busbw == pytest.approx(0.96 * 25.0, rel=0.01)


def test_calibrate_holds_a_term_and_counts_the_network_as_fitted(tmp_path, capsys):
    """`zsim calibrate --hold efficiency=V` keeps the term at V, says so in the written network's `fit.held`,
    and the report lists the fitted inter-node terms as fitted, not as kept from the base (they were listed
    as never touched before)."""
    write_tables(tmp_path / "tables", "abci-v100", [2, 4], 4)
    capsys.readouterr()
    out = tmp_path / "cal" / "mine.yaml"
    assert main(["calibrate", str(tmp_path / "tables"), "--profile", "abci-v100", "-o", str(out),
                 "--hold", "efficiency=0.96", "--json", str(tmp_path / "r.json")]) == 0
    import yaml

    net = yaml.safe_load((tmp_path / "cal" / "networks" / "mine-net.yaml").read_text())
    assert net["efficiency"] == 0.96 and list(net["fit"]["held"]) == ["efficiency"]
    assert "efficiency" not in net["fit"]["terms"] and "latency_us" in net["fit"]["terms"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert "inter_node.network.latency_us" in report["fitted_terms"]
    assert "inter_node.network.latency_us" not in report["kept_from_base"]
    assert "inter_node.network.efficiency" in report["kept_from_base"]  # held: not fitted by the inputs
    assert main(["calibrate", str(tmp_path / "tables"), "--profile", "abci-v100", "-o", str(out),
                 "--hold", "efficiency=7"]) == 2


def test_calibrate_refuses_a_network_fit_on_a_bound(shared_data, tmp_path, capsys):
    """ABCI's tables stop at 32 MiB: fitting every term pins LL128's share at its 120/128 bound (the reason
    ib-edr holds its efficiency, docs/fabric.md). `zsim calibrate` names that cause and writes nothing."""
    out = tmp_path / "abci.yaml"
    assert main(["calibrate", str(shared_data / "nccl-tests" / "abci-v100-ib-edr"), "--profile", "abci-v100",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ll128_share = 0.9375 ended on the fit's bounds" in err and not out.exists()


def test_calibrate_refuses_a_hold_it_would_not_use(tmp_path, capsys):
    """--hold names an inter-node term: with --fit compute, or with no multi-node tables, it would be
    ignored, so it is refused (exit 2) before anything is fitted."""
    write_tables(tmp_path / "tables", "abci-v100", [2], 4)
    capsys.readouterr()
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(tmp_path / "tables"), "--profile", "abci-v100", "-o", str(out), "--fit", "compute",
                 "--hold", "efficiency=0.9"]) == 2
    assert "--fit compute does not fit" in capsys.readouterr().err and not out.exists()
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "all_reduce.txt").write_text("# nothing\n")
    assert main(["calibrate", str(tmp_path / "single"), "--profile", "dgx2", "-o", str(out),
                 "--hold", "efficiency=0.9"]) == 2
    assert "holds an inter-node term" in capsys.readouterr().err
