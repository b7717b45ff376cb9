"""A role as an operator runs it: settings from a config file and flags, and the daemon built
from them. Above the roles (local_host, center_host), below the harness and the CLI."""
