"""Every setting is declared once (dedupnet/codec/settings.py) and everything else is
derived from it: the TOML checks, the flags and their --help, the daemons' settings
objects, ``dedupnet sim --processes``' daemon command lines and docs/DEPLOY.md's
reference. A setting added there shows up everywhere without another edit."""

import json
import re
import subprocess
import sys
from pathlib import Path

from center_host.config import FOREIGN_LOOKUPS, LOCAL_LOOKUPS, PARTITION_POLICIES, ROUTINGS
from dedupnet.codec.settings import SETTINGS
from dedupnet.service import settings_fields
from dedupnet.service.config import load_settings, reference_markdown

ROOT = Path(__file__).resolve().parent.parent

PROBE = r'''
import json, sys
from pathlib import Path
import dedupnet.codec.settings as declaration
declaration.SETTINGS["probe_linger"] = declaration.Setting(
    "probe_linger", float, 1.5, "seconds a probe lingers before it goes", frozenset({"center", "local", "sim"}),
    metavar="S")
from dedupnet.cli import build_parser
from dedupnet.harness import procplan, simcli
from dedupnet.service.config import load_settings, reference_markdown

toml = Path(sys.argv[1])
toml.write_text("probe_linger = 2.5\n")
parser = build_parser()
sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
cfg = simcli.config_from(parser.parse_args(["sim", "--networks", "1", "--hosts", "1", "--probe-linger", "3.5"]))
centers, hosts = procplan.plan_daemons(cfg, "redis://127.0.0.1:1", "p", toml.parent, ports={1: 7001})
print(json.dumps({
    "toml": load_settings(toml).probe_linger,
    "flag": load_settings(None, probe_linger=parser.parse_args(["local", "--probe-linger", "4"]).probe_linger).probe_linger,
    "reference": reference_markdown(),
    "help": {name: sub[name].format_help() for name in ("center", "local", "sim", "push")},
    "center": centers[0].argv, "host": hosts[0].argv,
}))
'''


def test_a_setting_declared_once_reaches_the_file_the_flags_the_help_the_reference_and_the_sim(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "d.toml")], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    seen = json.loads(out)
    assert seen["toml"] == 2.5 and seen["flag"] == 4.0
    assert "| `probe_linger` | `--probe-linger S` | center, local, sim | `1.5` | seconds a probe lingers" in seen["reference"]
    for name in ("center", "local", "sim"):
        assert "--probe-linger S" in seen["help"][name], name
    assert "seconds a probe lingers before it goes (default: 1.5)" in re.sub(r"\s+", " ", seen["help"]["local"])
    assert "--probe-linger" not in seen["help"]["push"]
    for argv in (seen["center"], seen["host"]):
        i = argv.index("--probe-linger")
        assert argv[i + 1] == "3.5"


def test_the_reference_in_docs_is_generated_from_the_declaration():
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    m = re.search(r"<!-- settings reference: generated.*?-->\n(.*?)<!-- end of the settings reference -->", text, re.S)
    assert m, "docs/DEPLOY.md lost its settings reference markers"
    assert m.group(1) == reference_markdown(), (
        "docs/DEPLOY.md's settings reference is out of date: paste `python -m dedupnet.service.config` between its "
        "markers")


def test_the_written_out_fields_are_the_declared_ones(tmp_path):
    assert settings_fields.current() == settings_fields.render(), (
        "dedupnet/service/settings_fields.py is out of date: run `python -m dedupnet.service.settings_fields`")
    # The check can fail: a copy with one field dropped differs, and writing it mends it.
    copy = tmp_path / "fields.py"
    copy.write_text(Path(settings_fields.__file__).read_text().replace("    lan: str | None  # default None\n", ""))
    assert settings_fields.current(copy) != settings_fields.render()
    settings_fields.write(copy)
    assert settings_fields.current(copy) == settings_fields.render()


def test_the_declared_choices_are_the_cores_own():
    assert SETTINGS["partition_policy"].choices == PARTITION_POLICIES
    assert SETTINGS["foreign_lookup"].choices == FOREIGN_LOOKUPS
    assert SETTINGS["local_lookup"].choices == LOCAL_LOOKUPS
    assert SETTINGS["routing"].choices == ROUTINGS


def test_every_path_in_a_config_file_resolves_against_that_file(tmp_path, monkeypatch):
    """Every path setting, given relative in a file, names the place beside the file
    whatever the current directory; the same path given as a flag stays relative to the
    current directory. The guide's list of path settings is the declared one."""
    paths = sorted(name for name, s in SETTINGS.items() if s.path)
    assert {"tls_cert", "lan_key_file", "data_dir", "seeds_file"} <= set(paths)
    conf = tmp_path / "etc" / "dedupnet"
    conf.mkdir(parents=True)
    (conf / "dedupnet.toml").write_text("".join(f'{name} = "sub/{name}"\n' for name in paths))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    from_file = load_settings("../etc/dedupnet/dedupnet.toml")
    assert {name: getattr(from_file, name) for name in paths} == {name: str(conf / "sub" / name) for name in paths}
    from_flags = load_settings("../etc/dedupnet/dedupnet.toml", **{name: f"flag/{name}" for name in paths})
    assert {name: getattr(from_flags, name) for name in paths} == {name: f"flag/{name}" for name in paths}
    sentence = re.search(r"A relative path in the file \(([^)]*)\)", (ROOT / "docs" / "DEPLOY.md").read_text())
    assert sorted(re.findall(r"`(\w+)`", sentence.group(1))) == paths
