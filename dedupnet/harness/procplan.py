"""Every daemon's command line for ``dedupnet sim --processes``: the same ``dedupnet center``
/ ``dedupnet local`` commands a user would type, with the run's settings, key prefixes,
relays, certificates, LAN key and (for a power cut) a disk of its own per daemon."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dedupnet.adapters.children import free_port
from dedupnet.codec.auth import keyring_from
from dedupnet.codec.settings import CENTER, LOCAL, SETTINGS, SIM
from dedupnet.harness.cluster import center_ip, host_ip, lan
from dedupnet.harness.faults import resolve
from dedupnet.harness.powercut import LoopDisk, unavailable
from dedupnet.harness.procdaemons import Daemon
from dedupnet.harness.relay import host_name, wan_name
from dedupnet.harness.report import SimConfig

__all__ = ["center_ports", "daemon_env", "disk_dir", "make_disks", "plan_daemons", "remove_disks", "run_settings",
           "wants_disks"]

_ROOT = Path(__file__).resolve().parents[2]  # holds dedupnet/, center_host/, local_host/


def center_ports(cfg: SimConfig) -> dict[int, int]:
    """A port free now for each center (it binds it a moment later; a lost race shows as
    a daemon exiting at start, reported with its log)."""
    return {n: free_port(center_ip(n)) for n in range(1, cfg.networks + 1)}


def _tls_flags(cfg: SimConfig, tls_dir: Path | None, role: str, network: int) -> list[str]:
    """``--secure``: a center's --tls-cert/--tls-key/--tls-ca (made by dedupnet certs'
    code for the run); with ``--lan-tls`` --lan-tls on both, and the CA for hosts."""
    if tls_dir is None:
        return []
    lan = ["--lan-tls"] if cfg.lan_tls else []
    if role == "center":
        return ["--tls-cert", str(tls_dir / f"center-{network}.pem"), "--tls-key",
                str(tls_dir / f"center-{network}-key.pem"), "--tls-ca", str(tls_dir / "ca.pem"), *lan]
    return [*lan, "--tls-ca", str(tls_dir / "ca.pem")] if lan else []


def plan_daemons(cfg: SimConfig, redis_url: str, prefix: str, logdir: Path, ports: dict[int, int] | None = None,
          via: dict[str, tuple[str, int]] | None = None,
          tls_dir: Path | None = None, key_file: Path | str | None = None) -> tuple[list[Daemon], list[Daemon]]:
    """Every daemon's command line. ``ports``: the centers' (drawn if None); ``via``:
    the relay address of each relayed link (``wan:A-B``, ``host:N.I``), given to the
    daemon that dials it instead of the center it reaches; ``tls_dir``: the run's
    certificates (``--secure``); ``key_file``: the LAN key file every daemon gets as
    ``--lan-key-file`` (``--lan-key``, ``--secure``)."""
    keyring = keyring_from(key_file)
    keys = [] if key_file is None else ["--lan-key-file", str(key_file), "--key-poll-interval", f"{cfg.key_poll_interval:g}"]
    cli = [sys.executable, "-m", "dedupnet.cli"]
    ports = ports if ports is not None else center_ports(cfg)
    via = via or {}
    # A power cut: every daemon keeps its data in its own embedded Redis on its own disk.
    power = wants_disks(cfg)

    def store_flags(target: str) -> list[str]:
        return ["--data-dir", str(disk_dir(logdir, target))] if power else ["--redis", redis_url]

    centers = []
    for n, port in ports.items():
        argv = [*cli, "center", "--network", str(n), "--ip", center_ip(n), "--lan", lan(n),
                "--listen", f"{center_ip(n)}:{port}", *store_flags(f"center:{n}"), "--prefix", f"{prefix}:center{n}",
                "--log-level", "INFO", *run_settings(cfg, CENTER),
                "--no-discovery"]  # hosts are told their center; a simulation opens no UDP port
        argv += _tls_flags(cfg, tls_dir, "center", n) + keys
        for m, peer_port in ports.items():
            if m != n:
                # The lower-numbered center dials the higher one (center_host/daemon.py _dial):
                # its --peer address is the link's relay if there is one.
                host, port_m = via.get(wan_name(n, m), (center_ip(m), peer_port)) if n < m else (center_ip(m), peer_port)
                argv += ["--peer", f"{m},{host}:{port_m},{lan(m)}"]
        centers.append(Daemon(f"center{n}", "center", n, (center_ip(n), port), f"{prefix}:center{n}", argv,
                              logdir / f"center{n}.log", keyring=keyring,
                              data_dir=disk_dir(logdir, f"center:{n}") if power else None))
    hosts = []
    own = {r.target for i, f in enumerate(cfg.faults) if f.kind == "kill-host-redis"
           for r in [resolve(f, cfg.seed, cfg.networks, cfg.hosts, i)]}
    for n in range(1, cfg.networks + 1):
        for i in range(cfg.hosts):
            ip = host_ip(n, i)
            port = free_port(ip)
            center_host, center_port = via.get(host_name(n, i), (center_ip(n), ports[n]))
            data_dir = (disk_dir(logdir, f"host:{n}.{i}") if power else
                        logdir / f"redis-{ip}" if f"host:{n}.{i}" in own else None)
            store = ["--redis", redis_url] if data_dir is None else ["--data-dir", str(data_dir)]
            argv = [*cli, "local", "--network", str(n), "--ip", ip, "--lan", lan(n),
                    "--center", f"{center_host}:{center_port}", "--listen", f"{ip}:{port}",
                    *store, "--prefix", f"{prefix}:host:{ip}", "--log-level", "INFO", *run_settings(cfg, LOCAL)]
            argv += _tls_flags(cfg, tls_dir, "host", n) + keys
            hosts.append(Daemon(ip, "host", n, (ip, port), f"{prefix}:host:{ip}", argv, logdir / f"host-{ip}.log",
                                keyring=keyring, data_dir=data_dir))
    return centers, hosts


def run_settings(cfg: SimConfig, role: str) -> list[str]:
    """The flags that give a daemon of ``role`` the run's value of every setting marked
    ``sim`` (dedupnet/codec/settings.py): a setting declared there reaches the daemons
    with no edit here."""
    return [arg for s in SETTINGS.values() if SIM in s.roles and role in s.roles for arg in s.argv(cfg.setting(s.name))]


def wants_disks(cfg: SimConfig) -> bool:
    """A ``power-cut`` run: every daemon's Redis on a disk of its own (dedupnet/harness/powercut.py)."""
    return any(f.kind == "power-cut" for f in cfg.faults)


def disk_dir(logdir: Path, target: str) -> Path:
    """The data dir of ``target``'s Redis on its own disk (mounted at ``disks/<target>/mnt``)."""
    return logdir / "disks" / target.replace(":", "-") / "mnt" / "data"


def make_disks(cfg: SimConfig, logdir: Path) -> dict[str, LoopDisk]:
    """One loop-mounted ext4 per daemon; every one made is removed again if one fails."""
    reason = unavailable()
    if reason is not None:
        raise ValueError(f"power-cut: {reason}")
    disks: dict[str, LoopDisk] = {}
    try:
        for target in [f"center:{n}" for n in range(1, cfg.networks + 1)] + [
                f"host:{n}.{i}" for n in range(1, cfg.networks + 1) for i in range(cfg.hosts)]:
            disks[target] = LoopDisk(disk_dir(logdir, target).parent.parent).create()
    except BaseException:
        remove_disks(disks)
        raise
    return disks


def remove_disks(disks: dict[str, LoopDisk]) -> list[str]:
    problems = []
    for target, disk in disks.items():
        try:
            disk.remove()
        except OSError as e:
            problems.append(f"the disk of {target} could not be unmounted: {e}")
    return problems


def daemon_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env
