import subprocess
import sys

import numpy as np
import pytest

from dedupnet.cli import build_parser, main
from dedupnet.service.config import load_settings
from local_host.local_dedup import local_reduce


def test_file_then_flags(tmp_path):
    cfg = tmp_path / "d.toml"
    cfg.write_text('set_size = 50\nmode = "paper"\nprefix = "lan1:h1"\n')
    s = load_settings(cfg, set_size=20, mode=None)
    assert (s.set_size, s.mode, s.prefix) == (20, "paper", "lan1:h1")


@pytest.mark.parametrize("text, message", [
    ("set_sise = 5\n", "unknown setting"),
    ('mode = "fast"\n', "mode must be one of"),
    ("set_size = 0\n", "set_size must be positive"),
    ("set_size = 20000\n", "cannot exceed"),
    ("network = 0\n", "network must be a network id within 1..65535"),
    ("network = 70000\n", "network must be a network id within 1..65535"),
])
def test_bad_settings_are_named(tmp_path, text, message):
    cfg = tmp_path / "d.toml"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_settings(cfg)


def test_cli_reports_bad_settings_without_traceback(tmp_path, capsys):
    cfg = tmp_path / "d.toml"
    cfg.write_text("nope = 1\n")
    assert main(["demo", "--config", str(cfg)]) == 2
    assert "unknown setting `nope`" in capsys.readouterr().err


def test_help_lists_the_subcommands():
    out = subprocess.run([sys.executable, "-m", "dedupnet.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for name in ("local", "center", "sim", "demo"):
        assert name in out
    assert build_parser().parse_args(["demo", "--urls", "5"]).urls == 5


def test_demo_runs_on_the_embedded_redis(redis_url, capsys):
    assert main(["demo", "--urls", "3000", "--redis", redis_url, "--prefix", "demo-test", "--set-size", "100"]) == 0
    out = capsys.readouterr().out
    assert "URL_sets framed with flag=1" in out and "INCONSISTENT" not in out


def test_local_reduce_drops_crawled_and_repeats_and_groups():
    urls = ["http://a/1", "http://a/2", "http://a/1", "http://a/3", "http://a/4", "http://a/5"]
    fps = np.array([1, 2, 1, 3, 4, 5], dtype=np.uint64)
    seen = np.array([False, True, False, False, False, False])
    r = local_reduce(urls, fps, seen, set_size=2)
    assert r.crawled == [1] and r.repeated == [2]
    assert r.url_sets == [{"http://a/1": 0, "http://a/3": 0}, {"http://a/4": 0, "http://a/5": 0}]


def test_the_cores_and_the_crawler_take_their_defaults_from_the_declarations():
    """One default a setting: a field of a core's or the crawler's settings object named
    like a declared setting defaults to the declared value (dedupnet/codec/settings.py)."""
    import dataclasses

    from center_host.config import CenterConfig
    from dedupnet.codec.settings import SETTINGS, default_of
    from local_host.crawler.settings import CrawlerSettings
    from local_host.protocol import HostConfig

    checked = 0
    for cls in (CenterConfig, HostConfig, CrawlerSettings):
        for f in dataclasses.fields(cls):
            if f.name not in SETTINGS:
                continue
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                continue  # required: the caller says
            declared = default_of(f.name)
            if SETTINGS[f.name].type is list:  # a list setting: any collection, empty alike
                value, declared = tuple(value or ()), tuple(declared or ())
            assert value == declared, f"{cls.__name__}.{f.name}: {value!r}, declared {declared!r}"
            checked += 1
    assert checked >= 15

