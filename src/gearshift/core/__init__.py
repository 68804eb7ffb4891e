"""The functional core: dims and gears, decayed statistics, the optimal sets, the policy.

Pure: numpy and the standard library only; no clock, I/O, threads or torch. Time comes in as
`now`, measurements as data, and a decision goes out.
"""
