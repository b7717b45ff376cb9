"""Named errors. Each carries a short machine-readable ``reason`` used as a counter label."""


class DedupnetError(Exception):
    """Base of every error dedupnet raises on purpose."""

    reason = "error"

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class ProtocolError(DedupnetError):
    """Input from the network that is not a valid message (bad header, body, or content).

    The connection that sent it is at fault; the daemon logs it, counts it under
    ``reason`` and carries on serving everyone else.
    """

    reason = "malformed"


class BadURL(DedupnetError):
    """A URL that may never enter a pool (bad scheme, no host, too long, undecodable)."""

    reason = "bad-url"


class StoreUnavailable(DedupnetError):
    """Redis could not be reached after the configured retries."""

    reason = "store-unavailable"


class DiscoveryError(DedupnetError):
    """``--center auto`` chose no center: nobody answered in time, or several did
    (dedupnet/adapters/net/discovery.py)."""

    reason = "no-center"


class SettingsError(DedupnetError, ValueError):
    """A setting that cannot work as given, found only once the daemon tries it: an
    address already in use, files that do not belong together. The operator must change
    something, so the command stops with this one line (exit status 2), never a retry."""

    reason = "settings"
