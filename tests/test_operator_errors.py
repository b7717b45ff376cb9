"""The mistakes operators really make, each ending in one line that names what to fix:
`dedupnet` run as a user runs it (a real process, real sockets, the real embedded
Redis), checked on stderr and the exit status. Configuration errors exit with 2; a
traceback appears only with ``--log-level DEBUG``."""

import os
import re
import signal
import socket
import subprocess
import time

import pytest

from .helpers import DEDUPNET, dedupnet, free_port

#: A daemon's own log records (its start-up before it meets the mistake).
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) ")


def the_line(out, who="dedupnet") -> str:
    """The one line that reports the mistake: no traceback, nothing else but the
    daemon's own start-up log records (there are none before the settings are read)."""
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if not LOG_RECORD.match(line)]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(who + ":"), lines[0]
    return lines[0]


def only_line(out, who="dedupnet") -> str:
    """The mistake was found before anything started: stderr is that one line."""
    assert len(out.stderr.splitlines()) == 1, out.stderr
    return the_line(out, who)


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    subprocess.run([*DEDUPNET, "certs", "--dir", str(d), "--networks", "1,2"], check=True, capture_output=True)
    return d


# -- on the command line --------------------------------------------------------------
def test_a_port_in_use_names_the_address(tmp_path, taken_port):
    out = dedupnet("center", "--network", "1", "--listen", f"127.0.0.1:{taken_port}", cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet center")  # said before Redis starts: no lines about it
    assert f"127.0.0.1:{taken_port}" in line and "--listen" in line and "in use" in line
    quiet = dedupnet("center", "--network", "1", "--listen", f"127.0.0.1:{taken_port}", "--log-level", "WARNING",
                cwd=tmp_path)
    assert quiet.returncode == 2 and only_line(quiet, "dedupnet center") == line


def test_a_port_in_use_for_http_names_the_address(tmp_path, taken_port):
    out = dedupnet("center", "--network", "1", "--listen", "127.0.0.1:0", "--http", f"127.0.0.1:{taken_port}",
              cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet center")
    assert f"127.0.0.1:{taken_port}" in line and "--http" in line and "in use" in line


def test_a_certificate_and_a_key_that_do_not_match_are_named(tmp_path, certs):
    cert, key = certs / "center-1.pem", certs / "center-2-key.pem"
    out = dedupnet("center", "--network", "1", "--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key),
              "--tls-ca", str(certs / "ca.pem"), cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet center")
    assert str(cert) in line and str(key) in line and "do not match" in line


def test_a_network_id_that_is_not_a_number_is_one_line(tmp_path):
    out = dedupnet("local", "--network", "abc", cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet local")
    assert "--network" in line and "'abc'" in line and "usage" not in out.stderr


def test_the_traceback_comes_with_debug_only(tmp_path, certs):
    args = ["center", "--network", "1", "--listen", "127.0.0.1:0", "--tls-cert", str(certs / "center-1.pem"),
            "--tls-key", str(certs / "center-2-key.pem"), "--tls-ca", str(certs / "ca.pem")]
    out = dedupnet(*args, "--log-level", "DEBUG", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" in out.stderr
    assert out.stderr.splitlines()[-1] == only_line(dedupnet(*args, cwd=tmp_path), "dedupnet center")


@pytest.mark.parametrize("args, line", [
    (["local", "--seed-file", "x"], "dedupnet local: unrecognized arguments: --seed-file x; did you mean --seeds-file? "
                                    "(see dedupnet local --help)"),
    (["center", "--nope"], "dedupnet center: unrecognized arguments: --nope (see dedupnet center --help)"),
])
def test_an_unknown_flag_names_the_subcommands_help(tmp_path, args, line):
    out = dedupnet(*args, cwd=tmp_path)
    assert out.returncode == 2 and only_line(out, "dedupnet " + args[0]) == line


@pytest.mark.parametrize("args", [["local", "--set-linger", "0.5"], ["center", "--gather-linger=0"],
                                  ["sim", "--set-linger", "0"], ["sim", "--gather-linger", "0.5"]])
def test_a_removed_setting_given_as_a_flag_says_so(tmp_path, args):
    """Sets wait for acknowledgements, not for a time: the lingers were removed, and an
    operator who still gives one is told so and why (not "unrecognized", not ignored)."""
    out = dedupnet(*args, cwd=tmp_path)
    line = only_line(out, "dedupnet " + args[0])
    assert out.returncode == 2 and "was removed" in line and "Nagle" in line and "leave it out" in line, line


@pytest.mark.parametrize("role, key", [("local", "set_linger"), ("center", "gather_linger")])
def test_a_removed_setting_in_the_config_file_says_so(tmp_path, role, key):
    cfg = tmp_path / "dedupnet.toml"
    cfg.write_text(f"{key} = 0.5\n")
    out = dedupnet(role, "--config", str(cfg), cwd=tmp_path)
    line = only_line(out, "dedupnet " + role)
    assert out.returncode == 2 and str(cfg) in line and f"{key} (--{key.replace('_', '-')}) was removed" in line, line


# -- in the config file -----------------------------------------------------------------
@pytest.mark.parametrize("text, named", [
    ('set_size = "500"\n', ["`set_size`", "an integer", '"500"']),
    ('network = 1\nlisten = "127.0.0.1:0"\npeers = [{network = 2, address = "10.2.0.1:7700"}]\n',
     ["`peers`", "list of", "NETWORK,HOST:PORT,CIDR", "tables"]),
    ('peer = ["2,127.0.2.1:7700,127.0.2.0/24"]\n', ["unknown setting `peer`", "did you mean `peers`?"]),
])
def test_a_mistake_in_the_config_file_names_the_key(tmp_path, text, named):
    cfg = tmp_path / "dedupnet.toml"
    cfg.write_text(text)
    out = dedupnet("center", "--config", str(cfg), cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet center")
    assert all(part in line for part in named), line
    assert str(cfg) in line
    assert "heartbeat_interval" not in line  # the suggestion, not the list of every key


def test_paths_in_the_config_file_are_relative_to_it(tmp_path, certs):
    """Run from another directory: the file's tls_* lines still find (and name) the files
    beside it."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "certs").symlink_to(certs)
    (conf / "c1.toml").write_text('network = 1\nlisten = "127.0.0.1:0"\ntls_cert = "certs/center-1.pem"\n'
                                  'tls_key = "certs/center-2-key.pem"\ntls_ca = "certs/ca.pem"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = dedupnet("center", "--config", "../conf/c1.toml", cwd=elsewhere)
    assert out.returncode == 2
    line = only_line(out, "dedupnet center")
    assert f"{conf / 'certs' / 'center-1.pem'} and tls_key {conf / 'certs' / 'center-2-key.pem'} do not match" in line


# -- the small clients -----------------------------------------------------------------
def test_push_without_a_daemon_says_none_was_found(tmp_path):
    out = dedupnet("push", "--data-dir", "host-data", "--ip", "127.0.1.10", "http://a.example/", cwd=tmp_path)
    assert out.returncode == 2
    assert "no daemon found in host-data" in only_line(out, "dedupnet push")


def test_push_after_the_daemon_was_killed_says_none_answers(tmp_path):
    """A SIGKILLed daemon leaves its redis.url behind, naming a server that is gone."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = s.getsockname()[1]
    (tmp_path / "host-data").mkdir()
    (tmp_path / "host-data" / "redis.url").write_text(f"redis://127.0.0.1:{gone}/0\n")
    out = dedupnet("push", "--data-dir", "host-data", "--ip", "127.0.1.10", "http://a.example/", cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet push")
    assert "no daemon found in host-data" in line and f"127.0.0.1:{gone}" in line


@pytest.fixture
def keyed_center(tmp_path):
    """A center whose config file names its LAN key file by a relative path."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "lan1.keys").write_text("1 " + "ab" * 32 + " send\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (conf / "c1.toml").write_text(f'network = 1\nlisten = "127.0.0.1:{port}"\nlan_key_file = "lan1.keys"\n'
                                  'data_dir = "c1-data"\n')
    proc = subprocess.Popen([*DEDUPNET, "center", "--config", "conf/c1.toml"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield conf / "c1.toml", f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_status_takes_the_key_file_from_the_daemons_config(tmp_path, keyed_center):
    config, address = keyed_center
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = dedupnet("status", "--config", str(config), cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"center {address}")


def test_status_without_the_key_says_so_in_a_sentence(tmp_path, keyed_center):
    config, address = keyed_center
    out = dedupnet("status", address, cwd=tmp_path)
    assert out.returncode == 1
    line = only_line(out, "dedupnet status")
    assert "needs the LAN key" in line and "--key-file" in line and "--config" in line
    assert "Error(" not in line and "reason=" not in line


def test_status_cluster_tries_each_key_file_until_one_is_taken(tmp_path, keyed_center):
    """One key file per LAN, the daemon's not the first: the answer made with a key this
    side does not hold is not the end of the survey, the next key is tried."""
    config, address = keyed_center
    (tmp_path / "other.keys").write_text("1 " + "cd" * 32 + " send\n")
    out = dedupnet("status", "--cluster", address, "--key-file", "other.keys", "--key-file", str(config.parent / "lan1.keys"),
              cwd=tmp_path)
    assert out.returncode == 5, out.stderr  # nothing was ever admitted: not started
    assert "verdict: not started" in out.stdout and f"center {address}" in out.stdout


# -- the data directory, Ctrl-C -----------------------------------------------------------
def wait_listening(port, proc, host="127.0.0.1", timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args[3:5]} exited with {proc.returncode}"
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} after {timeout} s")


def start(*args, cwd, log=None, **kw):
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen([*DEDUPNET, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT if log else out, **kw)


def test_a_second_daemon_on_a_data_directory_names_the_one_holding_it(tmp_path):
    port = free_port()
    first = start("center", "--network", "1", "--listen", f"127.0.0.1:{port}", "--data-dir", "c1", cwd=tmp_path)
    try:
        wait_listening(port, first)
        out = dedupnet("center", "--network", "1", "--listen", "127.0.0.1:0", "--data-dir", "c1", cwd=tmp_path)
        assert out.returncode == 2
        line = only_line(out, "dedupnet center")
        assert "data directory c1" in line and f"pid {first.pid}" in line and "--data-dir" in line
    finally:
        first.kill()  # no clean-up runs: the kernel alone releases the lock
        first.wait(timeout=20)
    again = start("center", "--network", "1", "--listen", f"127.0.0.1:{port}", "--data-dir", "c1", cwd=tmp_path)
    try:
        wait_listening(port, again)
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=20) == 0


def test_ctrl_c_stops_a_host_cleanly_with_its_redis(tmp_path):
    """The terminal sends SIGINT to the whole foreground process group: the embedded
    Redis must not get it, or the host loses it while its pages on the wire finish and
    it hands its tasks back."""
    from .procs import server_processes

    port, web_port, host_port = free_port(), free_port(), free_port()
    web = start("web", "--pages", "200", "--sites", "2", "--port", str(web_port), "--latency", "1.5", cwd=tmp_path,
                log=tmp_path / "web.log")
    center = start("center", "--network", "1", "--listen", f"127.0.1.1:{port}", cwd=tmp_path,
                   log=tmp_path / "center.log")
    host = None
    try:
        wait_listening(port, center, "127.0.1.1")
        wait_listening(web_port, web, "127.77.0.1")
        host = start("local", "--network", "1", "--ip", "127.0.1.10", "--center", f"127.0.1.1:{port}", "--listen",
                     f"127.0.1.10:{host_port}", "--seed", f"http://127.77.0.1:{web_port}/", cwd=tmp_path,
                     log=tmp_path / "host.log", start_new_session=True)
        wait_listening(host_port, host, "127.0.1.10")
        servers = server_processes(lambda ppid, cwd, cmd: ppid == host.pid)
        assert len(servers) == 1
        assert os.getpgid(servers[0][0]) != host.pid  # not in the group the terminal signals
        time.sleep(3)  # crawling: pages on the wire
        os.killpg(host.pid, signal.SIGINT)
        assert host.wait(timeout=30) == 0
    finally:
        for p in (host, center, web):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=20)
    log = (tmp_path / "host.log").read_text()
    assert "SIGINT received" in log and "handed back to the center" in log, log
    assert "died" not in log and "WARNING" not in log and "ERROR" not in log, log
    assert not server_processes(lambda ppid, cwd, cmd: cwd.startswith(str(tmp_path)))


@pytest.mark.parametrize("seed", ["example.com/page", "htp:/bad url"])
def test_a_seed_that_is_not_a_url_is_named(tmp_path, seed):
    out = dedupnet("local", "--network", "1", "--ip", "127.0.1.10", "--center", "127.0.1.1:1", "--seed", seed,
              cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet local")
    assert f"--seed {seed!r}" in line and "http://" in line


def test_a_seed_that_is_not_a_url_is_named_with_its_line(tmp_path):
    (tmp_path / "seeds.txt").write_text("# the two sites\nhttp://a.example/\n\nexample.com/page\n")
    out = dedupnet("local", "--network", "1", "--ip", "127.0.1.10", "--center", "127.0.1.1:1", "--seeds-file",
              "seeds.txt", cwd=tmp_path)
    assert out.returncode == 2
    assert "seeds_file seeds.txt line 4: 'example.com/page'" in only_line(out, "dedupnet local")


def test_a_center_given_another_networks_certificate_stops_at_start(tmp_path, certs):
    out = dedupnet("center", "--network", "1", "--listen", "127.0.0.1:0", "--tls-cert", str(certs / "center-2.pem"),
              "--tls-key", str(certs / "center-2-key.pem"), "--tls-ca", str(certs / "ca.pem"), cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet center")
    assert str(certs / "center-2.pem") in line and "dedupnet://network/2" in line and "--network" in line


# -- refusals no retry cures, and the ones a retry may -------------------------------------
@pytest.mark.parametrize("args, reason, setting", [
    (["--network", "2", "--lan-key-file", "conf/lan1.keys"], "wrong-network", "--network"),
    (["--network", "1"], "bad-tag", "--lan-key-file"),
])
def test_a_host_the_center_refuses_for_good_stops(tmp_path, keyed_center, args, reason, setting):
    config, address = keyed_center
    out = dedupnet("local", "--ip", "127.0.0.1", "--lan", "127.0.0.0/24", "--center", address, "--no-crawl", *args,
              cwd=tmp_path, timeout=30)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    line = out.stderr.splitlines()[-1]
    assert f"dedupnet local: the center at {address} refuses this host: {reason}" in line and f"check {setting}" in line


def lines_while_running(tmp_path, seconds, *args, after="listening on"):
    """A daemon's warnings and errors until ``seconds`` after its log first says
    ``after``, then stopped with SIGTERM, which must stop it cleanly (exit status 0)."""
    proc = start(*args, cwd=tmp_path, log=tmp_path / "daemon.log")
    log = tmp_path / "daemon.log"
    deadline = time.monotonic() + 60
    while after not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    time.sleep(seconds)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, log.read_text()
    return [line.split(": ", 1)[1] for line in log.read_text().splitlines() if " WARNING " in line or " ERROR " in line]


def test_an_unreachable_redis_is_named_every_few_seconds_not_every_retry(tmp_path):
    """...and a stop while it is away is a stop, not a failure."""
    lines = lines_while_running(tmp_path, 6, "local", "--network", "1", "--ip", "127.0.1.10", "--center",
                                "127.0.1.1:1", "--no-crawl", "--redis", f"redis://127.0.0.1:{free_port()}/0",
                                after="Redis call")
    redis = [line for line in lines if line.startswith("Redis call")]
    assert 1 <= len(redis) <= 3 and all("check --redis" in line for line in redis), lines
    assert lines[len(redis):] == [line for line in lines if "SIGTERM received" in line and "stopping now" in line]


def test_an_unreachable_center_is_named_with_its_setting(tmp_path):
    port = free_port()
    lines = lines_while_running(tmp_path, 7, "local", "--network", "1", "--ip", "127.0.1.10", "--center",
                                f"127.0.1.1:{port}", "--no-crawl")
    dials = [line for line in lines if f"cannot connect to 127.0.1.1:{port}" in line]
    assert 1 <= len(dials) <= 3 and all("check --center" in line for line in dials), lines


def test_a_quick_start_crawl_logs_less_than_a_line_per_ten_pages(tmp_path):
    """The default level shows what the operator follows: no line per request (httpx's
    own), none per routine 404 or robots.txt refusal, and no WARNING that needs no action."""
    port, web_port = free_port(), free_port()
    web = start("web", "--pages", "600", "--sites", "12", "--port", str(web_port), cwd=tmp_path,
                log=tmp_path / "web.txt")
    center = start("center", "--network", "1", "--listen", f"127.0.1.1:{port}", cwd=tmp_path)
    try:
        wait_listening(port, center, "127.0.1.1")
        wait_listening(web_port, web, "127.77.0.1")
        out = dedupnet("local", "--network", "1", "--ip", "127.0.1.10", "--center", f"127.0.1.1:{port}", "--seed",
                  f"http://127.77.0.1:{web_port}/", "--per-site-delay", "0.01", "--exit-when-complete",
                  cwd=tmp_path, timeout=120)
    finally:
        for p in (center, web):
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=20)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    pages = int(re.search(r"reachable from the seeds: (\d+) pages", (tmp_path / "web.txt").read_text())[1])
    assert pages > 400
    assert len(lines) < pages / 10, out.stderr
    assert not [line for line in lines if " WARNING " in line or " ERROR " in line], out.stderr


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o640, False), (0o600, False)])
def test_a_key_file_others_can_read_is_warned_of_once(tmp_path, mode, warned):
    keys = tmp_path / "lan1.keys"
    keys.write_text("1 " + "ab" * 32 + " send\n")
    keys.chmod(mode)
    lines = lines_while_running(tmp_path, 4, "center", "--network", "1", "--listen", f"127.0.0.1:{free_port()}",
                                "--lan-key-file", str(keys))
    assert lines == ([f"lan_key_file {keys} is readable by every user of this machine (mode 0644): anyone here "
                      f"can take the key; chmod o-rwx {keys}"] if warned else []), lines


def test_a_host_given_a_certificate_that_is_not_its_own_stops_at_start(tmp_path, certs):
    out = dedupnet("local", "--network", "1", "--ip", "127.0.1.10", "--center", "127.0.1.1:1", "--lan-tls",
              "--tls-cert", str(certs / "center-1.pem"), "--tls-key", str(certs / "center-1-key.pem"),
              "--tls-ca", str(certs / "ca.pem"), cwd=tmp_path)
    assert out.returncode == 2
    line = only_line(out, "dedupnet local")
    assert "not dedupnet://network/1/host/127.0.1.10" in line and "--ip" in line, line
