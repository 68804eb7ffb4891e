"""Benchmarks, run by `gearshift bench NAME`. Each reports speeds with a baseline from the same run."""
