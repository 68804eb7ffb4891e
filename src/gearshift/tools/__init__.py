"""Tools around the product: the trace simulator, traces, benchmarks, the demo, the stress run."""
