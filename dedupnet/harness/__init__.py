"""What is built on the product to try it: the simulations (in one process and as processes),
the synthetic web, the owner baseline, the cluster runner, fault injection, the demo. Nothing
below imports it (docs/ARCHITECTURE.md)."""
