"""Names echoed by `zsim profiles` carry no escape codes; a `--profiles` folder does not reach outside
itself through links; a scenario's run.output stays inside the working folder, as its name does
(issue 28)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SMALL
from zsim.cli import main
from zsim.config.profiles import Profiles
from zsim.errors import ConfigError
from zsim.scenario.scenario import load_scenario


def test_profiles_listing_strips_escape_codes_from_names_fields_and_files(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    system = yaml.safe_load((ROOT / "hwprofiles" / "dgx2.yaml").read_text())
    system["description"] = "desc \x1b[2J cleared"
    (folder / "odd\x1b[31mname.yaml").write_text(yaml.safe_dump(system))
    assert main(["profiles", "--profiles", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "odd" in out and not any(not c.isprintable() and c != "\n" for c in out)


def test_links_out_of_a_profiles_folder_are_not_followed(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "outside.yaml").symlink_to(ROOT / "hwprofiles" / "dgx2.yaml")
    inner = folder / "real.yaml"
    inner.write_text((ROOT / "hwprofiles" / "dgx2.yaml").read_text())
    (folder / "alias.yaml").symlink_to(inner)  # a link that stays inside is a profile
    names = Profiles.from_environment([folder]).names("system")
    assert "outside" not in names and "alias" in names and "real" in names
    with pytest.raises(ConfigError, match="no system profile 'outside'"):
        Profiles.from_environment([folder]).path("system", "outside")


@pytest.mark.parametrize("output", ["../../escape", "/tmp/absolute", "a/../../b", "~/home", "  "])
def test_run_output_is_held_inside_the_working_folder(tmp_path, output):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "run": {"output": output}}))
    with pytest.raises(ConfigError, match="a folder inside the working folder, without '..' \\(write elsewhere with -o"):
        load_scenario(path)


def test_run_output_inside_the_working_folder_is_used(tmp_path, monkeypatch):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "run": {"output": "results/a"}}))
    monkeypatch.chdir(tmp_path)
    assert load_scenario(path).output_dir == Path("results/a")
    assert main(["run", str(path)]) in (0, 3) and (tmp_path / "results" / "a" / "result.json").is_file()
    assert oct(os.stat(tmp_path / "results" / "a" / "result.json").st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
