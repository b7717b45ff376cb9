"""Settings: defaults, then a TOML config file, then command-line flags (last wins).

The settings themselves are declared in dedupnet/codec/settings.py; this module makes
them an object, checks a config file against them and writes their reference for
docs/DEPLOY.md (``python -m dedupnet.service.config``). The file is flat ``key = value``
TOML whose keys are the settings' names; an unknown key is an error that names it and
the closest known one, so a typo never passes silently.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.codec.homes import parse_weights
from dedupnet.codec.numbers import check_network
from dedupnet.codec.settings import RETIRED, SETTINGS, declared
from dedupnet.service.settings_fields import SettingsFields

MODES = SETTINGS["mode"].choices


class _Checked(SettingsFields):
    """What a :class:`Settings` checks beyond each value's type: the choices, the ranges,
    and the settings that only work together."""

    def __post_init__(self) -> None:
        if self.frontier is not None:
            frontier_endpoint(str(self.frontier))  # a ValueError naming what is wrong
        for setting in SETTINGS.values():
            value = getattr(self, setting.name)
            if setting.choices and value is not None and value not in setting.choices:
                raise ValueError(f"{setting.name} must be one of {', '.join(setting.choices)}, not {value!r}")
        parse_weights(self.weights)
        for earlier in self.previous_weights:
            parse_weights(earlier)
        if self.key_poll_interval <= 0:
            raise ValueError("key_poll_interval must be positive")
        for name in ("set_size", "max_frame_size", "max_urls_per_set", "max_url_length", "answer_timeout",
                     "heartbeat_interval", "heartbeat_timeout", "max_connections_per_source", "max_bytes_per_s",
                     "max_messages_per_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.network is not None:
            check_network(self.network)
        if not 1 <= self.discovery_port <= 65535:
            raise ValueError("discovery_port must be within 1..65535")
        if self.stop_grace < 0 or self.stop_timeout <= 0:
            raise ValueError("stop_grace must not be negative and stop_timeout must be positive")
        if self.discovery_timeout <= 0:
            raise ValueError("discovery_timeout must be positive")
        if self.per_site_concurrency < 1:  # a crawler that may never ask a site anything sits idle
            raise ValueError(f"per_site_concurrency (--per-site) must be at least 1, not {self.per_site_concurrency}")
        if self.per_site_delay < 0 or (self.max_depth is not None and self.max_depth < 0):
            raise ValueError("per_site_delay and max_depth must not be negative")
        if self.discovery_address is not None:
            try:
                ipaddress.IPv4Address(self.discovery_address)
            except ValueError:
                raise ValueError(f"discovery_address must be an IPv4 address, not {self.discovery_address!r}") from None
        if self.redis_maxmemory is not None:
            if not re.fullmatch(r"[1-9]\d*([kmg]b?)?", self.redis_maxmemory, re.I):
                raise ValueError(f"redis_maxmemory must be a size such as 512mb or 2gb, not {self.redis_maxmemory!r}")
            if self.redis_url is not None:  # the operator's server keeps its own configuration
                raise ValueError("redis_maxmemory sizes the embedded Redis; with redis_url, set maxmemory on that "
                                 "server (CONFIG SET maxmemory, and in its configuration)")
        if self.bucket_bits and not 8 <= self.bucket_bits <= 24:
            raise ValueError("bucket_bits must be 0 (the store's) or within 8..24")
        if self.set_size > self.max_urls_per_set:
            raise ValueError("set_size cannot exceed max_urls_per_set")
        from dedupnet.adapters.storage.bloom import spec_from

        spec_from(self)  # finish_url_filter, bloom_capacity, bloom_error_rate are valid
        if self.recrawl() is not None and self.finish_url_filter == "bloom":
            raise ValueError("recrawl_after cannot be combined with finish_url_filter = 'bloom' "
                             "(a Bloom filter cannot forget a URL)")

    def recrawl(self) -> RecrawlPolicy | None:
        """The :class:`~dedupnet.codec.ages.RecrawlPolicy` of ``recrawl_after`` and
        ``recrawl_sites``, or None (no URL ever ages). ValueError names a bad value."""
        return RecrawlPolicy.from_settings(self.recrawl_after, self.recrawl_sites)


if typing.TYPE_CHECKING:
    class Settings(_Checked):
        """What a type checker sees: the written-out fields (kept equal to the declarations
        by a test) of the class made below."""

        def __init__(self, **values: Any) -> None: ...
else:
    #: The operator's settings: one field per declared setting (dedupnet/codec/settings.py),
    #: of its type and default, checked when made.
    Settings = dataclasses.make_dataclass(
        "Settings", [(s.name, s.annotation, declared(s.name)) for s in SETTINGS.values()], bases=(_Checked,),
        namespace={"__module__": __name__, "__doc__": "Every setting of a daemon: defaults < file < flags."})


def values_for(settings: Any, cls: type) -> dict[str, Any]:
    """The fields of a role's settings object ``cls`` that carry a setting (made with
    :func:`~dedupnet.codec.settings.declared`), filled from ``settings`` by that name."""
    return {f.name: getattr(settings, f.metadata["setting"]) for f in dataclasses.fields(cls)
            if "setting" in f.metadata}


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Defaults < file < overrides (``None`` overrides are ignored: flag not given).
    ValueError names the first mistake: the file, the key, what was expected."""
    values: dict[str, Any] = {}
    if path is not None:
        values.update(read_settings_file(path))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values)


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """A config file's settings, checked against :class:`Settings`: every key known, every
    value of its field's type, relative paths made relative to the file's directory."""
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    hints = typing.get_type_hints(Settings)
    for key, value in values.items():
        if key in RETIRED:
            raise ValueError(f"{path}: {RETIRED[key].message()}")
        if key not in hints:
            close = difflib.get_close_matches(key, hints, n=1)
            hint = f"did you mean `{close[0]}`?" if close else "the settings are listed in docs/DEPLOY.md"
            raise ValueError(f"unknown setting `{key}` in {path}: {hint}")
        expected = _type_problem(key, value, hints[key])
        if expected:
            raise ValueError(f"`{key}` in {path} must be {expected}, not {_toml_kind(value)}")
    base = Path(path).resolve().parent
    for key in (s.name for s in SETTINGS.values() if s.path):
        if isinstance(values.get(key), str):
            values[key] = str(base / Path(values[key]).expanduser())
    return values


def _type_problem(key: str, value: Any, hint: Any) -> str | None:
    """None if ``value`` fits the annotation ``hint``; else what was expected, in words."""
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kind = next(k for k in typing.get_args(hint) if k is not type(None)) if optional else hint
    if kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if kind is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if kind is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if kind is str:
        return None if isinstance(value, str) else "a string"
    if typing.get_origin(kind) is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return None if ok else "a list of " + SETTINGS[key].items
    return None


def _toml_kind(value: Any) -> str:
    """A TOML value as an operator wrote it: ``a string ("500")``, ``a list of tables``."""
    if isinstance(value, str):
        return f'a string ("{value}")'
    if isinstance(value, bool) or not isinstance(value, (list, dict)):
        return f"{str(value).lower() if isinstance(value, bool) else value}"
    if isinstance(value, dict):
        return "a table"
    words = {str: "strings", dict: "tables", list: "lists", bool: "booleans"}
    return "a list of " + " and ".join(sorted({words.get(type(v), "numbers") for v in value}))


def endpoint(text: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``[addr]:port``) to a pair; ValueError names what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def frontier_endpoint(text: str) -> tuple[str, int]:
    """``--frontier``: ``"host:port"``, or a port alone (on loopback: safe by default)."""
    return ("127.0.0.1", int(text)) if text.isdigit() and int(text) <= 65535 else endpoint(text)


def reference_markdown() -> str:
    """The configuration reference of docs/DEPLOY.md, one row per declared setting."""
    rows = ["| key | flag | read by | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        value = s.metavar or "|".join(s.choices)
        flag = f"`{s.option}{' ' + value if value else ''}`".replace("|", "\\|") if s.option else "(file only)"
        roles = ", ".join(r for r in ("center", "local", "push", "demo", "sim") if r in s.roles)
        rows.append(f"| `{s.name}` | {flag} | {roles} | {_shown(s.default)} | {s.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def _shown(default: Any) -> str:
    if default is None or default == ():
        return "none"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f'`"{default}"`' if isinstance(default, str) else f"`{default}`"


if __name__ == "__main__":
    print(reference_markdown(), end="")
