"""Benchmarks over all layers: each script prints measured numbers with the command that reproduces them."""
