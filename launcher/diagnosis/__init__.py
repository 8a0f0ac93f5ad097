"""What went wrong in a job, and how npurun says it: every rank's state gathered and classified
into one verdict (culprits, a deadlock's wait-for cycle, a fail-slow rank), the report and the
failure summary that agree with it, and the live status table of a running job.

Pure classification (``verdict``, ``waitfor``, ``rankinfo``, ``failslow``) reads plain data;
``diagnose`` plugs it into the agent (``launcher.agent``'s hooks) and the job's store.
"""
