"""Adapters to the network: TCP framing (transport), TLS, a daemon's listeners, rate
limits, the machine's interfaces (netinfo) and LAN discovery."""
