"""Settings: defaults, then a TOML config file, then command-line flags (last wins).

The file is flat ``key = value`` TOML whose keys are the field names below; an
unknown key is an error that names it, so a typo never passes silently.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("exact", "paper")


@dataclass
class Settings:
    #: Redis to use; none = start the embedded server.
    redis_url: str | None = None
    #: Key prefix of this host's or center's pools on that server.
    prefix: str | None = None
    #: Fingerprint sets are split into 2**bucket_bits intsets (see dedupnet/store.py).
    bucket_bits: int = 10
    #: URLs per URL_set (paper §2.2 step 3: "a fixed size").
    set_size: int = 1000
    #: Largest frame body accepted from the network, checked before reading it.
    max_frame_size: int = 4 * 1024 * 1024
    #: Largest URL_set accepted from the network.
    max_urls_per_set: int = 10_000
    #: Longest normalised URL admitted into a pool.
    max_url_length: int = 2048
    #: ``exact`` (no URL admitted twice) or ``paper`` (the paper's look-ups only).
    mode: str = "exact"
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        for name in ("set_size", "max_frame_size", "max_urls_per_set", "max_url_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if not 8 <= self.bucket_bits <= 24:
            raise ValueError("bucket_bits must be within 8..24")
        if self.set_size > self.max_urls_per_set:
            raise ValueError("set_size cannot exceed max_urls_per_set")


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Defaults < file < overrides (``None`` overrides are ignored: flag not given)."""
    values: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            values.update(tomllib.load(f))
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown setting(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return Settings(**values)
