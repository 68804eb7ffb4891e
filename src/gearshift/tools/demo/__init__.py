"""`gearshift demo`: static gears against adaptive ones, end to end on the CPU.

`workload` turns a trace into the requests the workers replay and the model's cost (no
torch), `clock` is the adaptive run's trace-time clock, `worker` is a worker process (torch),
`run` starts and supervises everything and measures, `cli` is the command.
"""
