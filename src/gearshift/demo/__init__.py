"""`gearshift demo`: adaptive gears against static power-of-two gears, end to end on the CPU.

`workload` turns a trace into the events the workers replay (no torch), `worker` is a worker
process (torch), `run` starts and supervises everything and measures, `cli` is the command.
"""
