"""The sans-I/O layer both roles share: the paper's frame and its wire format, set numbers,
URL rules, named errors, frame tags. Imports nothing else of the project (docs/ARCHITECTURE.md)."""
