"""What went wrong in a job, in words: every rank's state classified into one verdict (culprits,
a deadlock's wait-for cycle: ``verdict``, ``waitfor``, ``rankinfo``; a fail-slow rank:
``failslow``), the report and the failure summary that agree with it (``report``, ``summary``),
and the live status table's exchange with ``npurun --status`` (``status``).

Pure: reads plain data (published states, error files, stacks) and returns text and JSON-able
dicts; imports nothing of the agent or the processes. The agent's ``diagnose`` gathers the
data and calls it.
"""
