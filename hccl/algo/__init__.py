"""hccl's algorithms and the executor that runs them, apart from the communicator and transport.

``steps`` (the vocabulary: Send, Recv, Copy, LocalReduce; chunk layouts), ``rooted`` and
``schedule`` (pure schedules of one rank; ``schedule.choose`` picks one by size and world),
``reduction`` (the reduce functions), ``plan`` (the call shapes' bounded caches), ``executor``
(binds a schedule to buffer views and pairs once: a ``Program`` of typed steps, one loop),
``translate`` (a failed step becomes the user's exception, once) and ``fusion`` (a task graph's
adjacent small AllReduces as one exchange).

Arrows: algo -> hccl's leaves (errors, types, flight, failure, abortrec, wire) and
``hccl.transport`` (the executor's pairs); ``hccl.transport.base`` reads ``plan``'s fingerprint
cache; ``fusion`` -> runtime (graph, memory). Nothing here imports ``hccl.call``, ``hccl.comm``
or ``hccl.collectives``. Importing this package imports none of its modules.
"""
