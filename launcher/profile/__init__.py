"""Where a profiled job's time went, from its ranks' Chrome traces (``runtime.profiler``):
``tracemerge`` merges them into one trace, ``parts`` splits each rank's steps (compute,
collectives, late-peer waits, copies, host), ``fluctuation`` flags calls and ranks far outside
their usual time, ``summary`` prints and writes the whole (``npurun --profile``).

Reads files only: imports nothing of npurun (numpy, the standard library).
"""
