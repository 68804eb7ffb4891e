"""`gearshift demo`: static gears against adaptive ones, end to end on the CPU.

`workload` turns a trace into the requests the workers replay and the model's cost (no
torch), `clock` is the adaptive run's trace-time clock, `worker` is a worker process (torch),
`processes` starts, asks and ends the workers, `watch` follows the gears published, `figures`
is what a run measures, `run` calibrates and runs the two arms interleaved, `cli` is the
command. How the demo measures: docs/tools.md.
"""
