"""`gearshift demo`: static gears against adaptive ones, end to end on the CPU.

`workload` turns a trace into one profile's requests and the model's cost, `mix` merges the
profiles' requests on one timeline (no torch in either), `clock` is the adaptive run's
trace-time clock, `block` and `llama` are the models, `tp` shards the Llama over an instance's
gloo ranks (`--tp`), `arm` is one arm in a worker (a lane per profile), `lockstep` the arms of
a tensor-parallel rank, `worker` is a worker process (torch), `processes` starts, asks and ends
the workers, `watch` follows the gears published, `figures` is what a run measures, `run`
calibrates and runs the two arms interleaved, `cli` is the command and `table` its table. How
the demo measures: docs/tools.md.
"""
