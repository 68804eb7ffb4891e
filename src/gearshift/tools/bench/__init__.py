"""Benchmarks, run by `gearshift bench NAME`; each speed comes with a same-run baseline."""
