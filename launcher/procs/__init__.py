"""The ranks' processes: their environment and command line, how they start (a fresh
interpreter, or a fork of the node's fork server), their output, their Python stacks on request,
how they stop, and the cleaning of what they leave (process groups, shared memory, temp dirs).

Empty on purpose: a rank imports ``launcher.procs.proctitle`` (and its fork server
``launcher.procs.forkserver``) before its own code runs.
"""
