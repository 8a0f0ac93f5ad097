"""The core's hook points: how the profiler, the stream sanitizer and graph capture observe it.

runtime's core (``current``, ``context``, ``stream``, ``event``, the memory room, ``array``,
``kernels``) imports nothing above it. The observers import the core and attach here; the core
reads a hook point and calls what is attached, never a module by name (tinygrad's device
contract; torch's allocator trace hooks). Each attribute is ``None`` while nothing observes, so
the core pays one module-attribute read per point, as it paid one for ``profiler.on``:

    chk = hooks.stream_check
    if chk is not None:
        chk.access(stream, "memcpy_async", site, reads, writes)

Hook points (the methods the core calls on what is attached):

- ``profiler``: ``runtime.profiler`` while a recording is on (``start`` / ``stop_and_write``).
  ``task_start()`` before a stream runs a task and ``task_end(began, track, name, category,
  meta, site, seq)`` after; ``now_us()`` and ``record(track, name, category, t0, t1, meta,
  site)`` around a host-synchronous copy run inline.
- ``stream_check``: ``runtime.sanitizer`` while the stream check is on
  (``enable_stream_check``). ``access`` / ``host_access`` before a task or a host-synchronous
  call; ``freeing`` at a free; ``event_recorded``, ``stream_waits_event``,
  ``stream_waits_stream``, ``host_waits_stream``, ``host_waits_event``,
  ``device_synchronized`` and ``forget`` as the streams, events and devices synchronize.
- ``capture``: ``runtime.graph`` while a capture runs somewhere in the process.
  ``refuse(what)`` raises GraphCaptureError when the calling thread captures (what cannot be
  captured: a synchronize, malloc, free ...); ``capturing()`` is that thread's capture or None.
- ``context_created`` (a list): each ``fn(device_id)`` runs when ``set_device`` is about to make
  a device's context in this process (NPUSIM_PROFILE_DIR's trace starts there: runtime's
  ``__init__``).
- ``stream_created`` (a list): each ``fn(stream)`` runs when a stream is made (the profiler
  names its track).

Only the observer that owns a point sets it. This module imports nothing.
"""
from __future__ import annotations

profiler = None             # runtime.profiler while it records
stream_check = None         # runtime.sanitizer while the stream check is on
capture = None              # runtime.graph while a capture runs
context_created: list = []  # fn(device_id), before a device's context is made
stream_created: list = []   # fn(stream), when a stream is made
