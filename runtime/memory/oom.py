"""The pool's OutOfMemoryError: what was asked, what the device and the card hold, what to do.

``oom_error`` builds the error ``CachingAllocator`` raises when no segment can be reserved: the
device's capacity, what this process allocated and reserved, what other processes reserve on the
same card (card.py's ledger), the free bytes, the limit, the largest free block and what refused
the segment; the fix names the knobs that apply. The error also carries those numbers as
attributes (``err.reserved``, ``err.holders``...) and is torch's ``OutOfMemoryError`` too once
torch is imported (card.out_of_memory).
"""
from __future__ import annotations

from ..errors import OutOfMemoryError
from .card import describe as describe_holders
from .card import out_of_memory
from .pool_args import format_size


def oom_error(device_id: int, size: int, nbytes: int, policy, *, capacity: int, allocated: int,
              reserved: int, limit: int, largest: int, raw_error, raw, hint: str = ""
              ) -> OutOfMemoryError:
    """The error for a request of ``nbytes`` (``size`` rounded) under ``policy``;
    ``raw_error``: (segment size, the refusal) of the last reservation that failed, or None;
    ``raw``: the pool's raw allocator (its ``card``, when it has one); ``hint``: a last word
    for the fix (the policy's)."""
    card = raw_error[1] if raw_error is not None and hasattr(raw_error[1], "holders") else None
    holders = card.holders if card is not None else []
    if card is None and getattr(raw, "card", None) is not None:
        holders = raw.card.others()         # refused by the limit: the card's state too
    others = sum(h.reserved for h in holders)
    facts = (f"device {device_id}; {format_size(capacity)} total capacity; "
             f"{format_size(allocated)} already allocated; {format_size(reserved)} reserved in "
             f"total by the pool; ")
    if others:
        facts += (f"{format_size(others)} reserved by other processes on this card "
                  f"({describe_holders(holders)}); ")
    facts += (f"{format_size(max(capacity - reserved - others, 0))} free; limit "
              f"{format_size(limit)}; largest free block {format_size(largest)}")
    if card is not None:
        facts += f"; the card refused a segment of {format_size(raw_error[0])}"
    elif raw_error is not None:
        facts += (f"; the device address space refused a segment of {format_size(raw_error[0])}"
                  + (f" ({raw_error[1]})" if str(raw_error[1]) else ""))
    fix = ("Free tensors you no longer need, call runtime.empty_cache(), reduce the batch "
           "size, or raise NPUSIM_HBM_BYTES")
    if others:
        fix += " or free memory in the other processes on this device (npusim-smi info)"
    if limit < capacity:
        fix += " or the fraction given to runtime.set_per_process_memory_fraction()"
    fix += hint
    msg = f"NPU out of memory. Tried to allocate {format_size(size)} ({facts}). {fix}."
    err = out_of_memory(msg)                     # also torch's, once torch is imported
    err.device_id = device_id
    err.others_reserved = others
    err.holders = [{"pid": h.pid, "job": h.job, "rank": h.rank, "reserved": h.reserved}
                   for h in holders if h.reserved]
    err.requested = nbytes
    err.size = size
    err.capacity = capacity
    err.allocated = allocated
    err.reserved = reserved
    err.limit = limit
    err.largest_free_block = largest
    err.policy = int(policy)
    return err
