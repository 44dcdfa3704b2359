"""Held-out validation (issue 10), as a test that can fail: record the CPU suite's runs with the real
runtime, calibrate the host profile on some, replay the others; step time median |error| <= 10%, none
beyond 25%, model states exact (zsim/validate/suites/replay-cpu.yaml).

Its timings are only meaningful when the suite's ranks have the cores to themselves, so it is marked
`serial` and left out of `make test`: `make validate-replay` runs it alone (DESIGN.md: time-slicing
ranks vary 10-30x). About 100 s on a quiet 2-core machine (every entry recorded 3 times)."""

from __future__ import annotations

import numpy as np
import pytest

from zsim.validate.replay import DEFAULT_SUITE, run_suite


@pytest.mark.serial
@pytest.mark.slow
def test_held_out_replays_meet_the_criteria(tmp_path):
    result = run_suite(DEFAULT_SUITE, tmp_path)
    print("\n" + result.table())
    assert all(o.unmatched == 0 for o in result.outcomes), "ops that do not line up"
    assert all(o.states_exact for o in result.judged), "model states differ"
    assert result.passed, result.table()


UNSEEN_SUITE = DEFAULT_SUITE.with_name("replay-cpu-unseen.yaml")


@pytest.mark.serial
@pytest.mark.slow
def test_runs_held_out_by_shape_and_stage_together_come_within_15_percent(tmp_path):
    """Issue 26 item 4: a hidden size and a stage that no calibration run used, every run within 15%."""
    result = run_suite(UNSEEN_SUITE, tmp_path)
    print("\n" + result.table())
    assert result.criteria.max_step_error == 0.15 and all(o.states_exact for o in result.judged)
    assert result.passed, result.table()


def test_the_unseen_suite_holds_out_shape_and_stage_together():
    """Every held-out run of replay-cpu-unseen.yaml has a shape (layers, hidden) and a ZeRO stage that no
    calibration run has: the suite tests what it says it tests."""
    from zsim.config.yamlfile import read_yaml_mapping
    from zsim.validate.replay import load_suite, scenario_path

    suite = load_suite(UNSEEN_SUITE)

    def shape(entry):
        model = read_yaml_mapping(scenario_path(UNSEEN_SUITE, entry.scenario))["model"]
        return model["layers"], model["hidden"]

    fitted_shapes, fitted_stages = {shape(e) for e in suite.calibrate}, {e.stage for e in suite.calibrate}
    assert suite.replay and all(shape(e) not in fitted_shapes and e.stage not in fitted_stages for e in suite.replay)
    assert all(h not in {fh for _, fh in fitted_shapes} for _, h in map(shape, suite.replay))


def test_recordings_alternate_between_fit_and_judged_runs():
    """A drift of the machine's speed must hit the runs to fit and the runs to judge alike."""
    from zsim.validate.replay import Entry, interleaved

    fit = [Entry(scenario=f"f{i}.yaml", stage=0) for i in range(4)]
    judged = [Entry(scenario=f"j{i}.yaml", stage=1) for i in range(2)]
    order = [e.scenario for e in interleaved(fit, judged)]
    assert order == ["f0.yaml", "j0.yaml", "f1.yaml", "j1.yaml", "f2.yaml", "f3.yaml"]


def test_the_table_states_the_measurements_own_noise(tmp_path):
    """The first held-out run is recorded twice; how far apart the two land is printed beside the verdict."""
    from zsim.validate.replay import Criteria, Outcome, SuiteResult

    outcome = Outcome("gpt-tiny-b-s0-ga4", 0.200, 0.190, True, 10, 0, True)
    result = SuiteResult(tmp_path / "suite.yaml", tmp_path / "p.yaml", [outcome],
                         Criteria(median_step_error=0.1, max_step_error=0.25), (0.1, 0.1, 0.1), 2,
                         repeat=("gpt-tiny-b-s0-ga4", 0.200, 0.230))
    assert result.noise == pytest.approx(0.15)
    assert "200.00ms, then 230.00ms (15.0% apart)" in result.table()
    assert result.as_dict()["noise_floor"]["difference"] == pytest.approx(0.15)


def test_repeated_recordings_are_judged_on_their_median(tmp_path):
    """With `repeats`, a held-out run's measured step is the median of its recordings, each recording is
    printed, and the noise floor is the widest spread of one run's recordings."""
    from zsim.validate.replay import Criteria, Outcome, SuiteResult

    outcomes = [Outcome("a", 0.200, 0.190, True, 10, 0, True, recordings_s=(0.210, 0.200, 0.180)),
                Outcome("b", 0.100, 0.120, True, 10, 0, True, recordings_s=(0.100, 0.150, 0.095))]
    result = SuiteResult(tmp_path / "suite.yaml", tmp_path / "p.yaml", outcomes,
                         Criteria(median_step_error=0.1, max_step_error=0.25), (0.1, 0.1, 0.1), 2)
    assert outcomes[0].spread == pytest.approx(0.210 / 0.180 - 1)
    assert result.noise == pytest.approx(0.150 / 0.095 - 1)
    text = result.table()
    assert "210.0 / 200.0 / 180.0 ms (17% apart)" in text and "up to 57.9% apart" in text
    assert result.as_dict()["runs"][1]["recordings_s"] == [0.100, 0.150, 0.095]
    assert result.median_error == pytest.approx(np.median([0.05, 0.20]))
    assert "warning: the machine moved more than the criterion (one run's recordings are 58% apart)" in text
    quiet = SuiteResult(tmp_path / "suite.yaml", tmp_path / "p.yaml", outcomes[:1],
                        Criteria(median_step_error=0.1, max_step_error=0.25), (0.1, 0.1, 0.1), 2, steal=0.25)
    assert "the hypervisor took 25% of the CPU time" in quiet.table() and "stolen by the hypervisor" in quiet.table()


def test_a_suite_repeats_each_entry_in_rounds(tmp_path, monkeypatch):
    """Every entry is recorded `repeats` times, round after round of the interleaved order, and the fit
    gets every recording of the calibration entries (the runtime, the fit and the check of this machine's CPU
    against the base profile's are stood in for here: what is checked is the order and what reaches them)."""
    from pathlib import Path

    import zsim.commands.calibrate as calibrate_command
    import zsim.commands.replay as replay_command
    from zsim.validate import replay as suite_module

    suite = tmp_path / "suite.yaml"
    suite.write_text("base_profile: dev-2core\nranks: 2\nsteps: 2\nrepeats: 2\n"
                     "calibrate: [{scenario: calibrate/gpt-tiny-a.yaml, stage: 0}]\n"
                     "replay: [{scenario: calibrate/gpt-tiny-b.yaml, stage: 2}]\n"
                     "criteria: {median_step_error: 0.1, max_step_error: 0.25}\n")
    recorded, fitted = [], []
    monkeypatch.setattr(suite_module, "machine_mismatch", lambda suite: None)
    monkeypatch.setattr(suite_module, "record", lambda s, p, e, out, label=None: recorded.append(label) or Path(label))
    monkeypatch.setattr(calibrate_command, "calibrate", lambda inputs, *a, **k: fitted.extend(inputs) or {})
    steps = iter([0.100, 0.130])
    monkeypatch.setattr(replay_command, "replay", lambda folder, profile: (
        {"alignment": {"lined_up": 5, "measured_only": [], "simulated_only": []}, "run": {"backend": "gloo"},
         "model_states_bytes": {}, "step_seconds": {"measured": next(steps), "simulated": 0.110}}, None))
    result = suite_module.run_suite(suite, tmp_path)
    assert recorded == ["gpt-tiny-a-s0-ga1", "gpt-tiny-b-s2-ga1", "gpt-tiny-a-s0-ga1-r2", "gpt-tiny-b-s2-ga1-r2"]
    assert [str(f) for f in fitted] == [recorded[0], recorded[2]]
    assert result.outcomes[0].recordings_s == (0.100, 0.130) and result.outcomes[0].measured_s == pytest.approx(0.115)
    assert result.repeat is None


def test_stolen_cpu_time_is_the_share_of_field_8():
    """/proc/stat's steal field over all CPU time between two readings (a VM's noise, printed)."""
    from zsim.validate.replay import cpu_times, steal_share

    before = [100, 0, 50, 800, 0, 0, 0, 50, 0, 0]
    after = [200, 0, 100, 1000, 0, 0, 0, 100, 0, 0]
    assert steal_share(before, after) == pytest.approx(50 / 400)
    assert steal_share(None, after) is None
    now = cpu_times()
    if now is not None:  # Linux: a real reading; counters only grow, so the share is in [0, 1]
        assert len(now) >= 8
        share = steal_share(now, cpu_times())
        assert share is None or 0.0 <= share <= 1.0  # None: no CPU time passed between the readings


def test_a_poor_calibration_is_printed_beside_the_verdict(tmp_path):
    """The suite writes a poor fit rather than stopping (the held-out replays judge it), and prints its
    causes next to the verdict as a warning that the machine, not only the model, was measured."""
    from zsim.validate.replay import Criteria, Outcome, SuiteResult

    poor = {"warning": {"poor_fit": ["host compute: in-sample median error 82% > 15%"]}}
    result = SuiteResult(tmp_path / "suite.yaml", tmp_path / "p.yaml", [Outcome("a", 0.2, 0.19, True, 10, 0, True)],
                         Criteria(median_step_error=0.1, max_step_error=0.25), (0.1, 0.1, 0.1), 2, calibration=poor)
    text = result.table()
    assert "calibration: a poor fit (1 cause): host compute: in-sample median error 82% > 15%" in text
    assert "the calibration was a poor fit" in text and result.passed  # the verdict is printed as measured
    clean = SuiteResult(tmp_path / "suite.yaml", tmp_path / "p.yaml", [Outcome("a", 0.2, 0.19, True, 10, 0, True)],
                        Criteria(median_step_error=0.1, max_step_error=0.25), (0.1, 0.1, 0.1), 2, calibration={})
    assert "poor fit" not in clean.table()


def test_a_base_profile_of_another_cpu_is_refused_before_anything_is_recorded(tmp_path, monkeypatch):
    """The suite calibrates its base profile (dev-2core, measured on one CPU model) on runs of this machine;
    `zsim calibrate` refuses runs of another CPU, so on such a machine the suite stops before recording (minutes),
    naming both CPUs and what to do, and its dry run says so. On the profile's own CPU (clock suffix or not) it
    has nothing to say."""
    import zsim.calibrate.machines as machines
    from zsim.errors import ConfigError
    from zsim.validate.replay import load_suite, plan_suite, run_suite
    from zsim.validate.replay_suite import machine_mismatch

    suite = load_suite(DEFAULT_SUITE)
    monkeypatch.setattr(machines, "this_cpu", lambda: "Intel(R) Xeon(R) Processor @ 2.50GHz")
    assert machine_mismatch(suite) is None and plan_suite(DEFAULT_SUITE).machine is None
    monkeypatch.setattr(machines, "this_cpu", lambda: "Some Other CPU 9000")
    why = machine_mismatch(suite)
    assert why and "Some Other CPU 9000" in why and "Intel(R) Xeon(R) Processor" in why and "hostprobe" in why
    assert f"refused here: {why}" in plan_suite(DEFAULT_SUITE).table()
    assert plan_suite(DEFAULT_SUITE).as_dict()["refused_here"] == why  # --json says it too
    with pytest.raises(ConfigError) as err:
        run_suite(DEFAULT_SUITE, tmp_path / "out")
    assert err.value.path == "base_profile" and "Some Other CPU 9000" in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing recorded
