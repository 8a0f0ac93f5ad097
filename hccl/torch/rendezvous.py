"""How the "hccl" torch backend finds its world: npurun's job store, or the Store torch hands it.

Design note. Two ways in, one trust rule each (docs/torch.md, "Trust model"):

- Under npurun or launcher.spawn the job secret is in the environment and MASTER_ADDR:MASTER_PORT
  is npusim's authenticated store, not a torch TCPStore. torch's ``env://`` rendezvous is
  routed there (``JobStore``, torch's Store API over npusim's store client), for every backend,
  and the world communicator comes from ``hccl.init_comm()``. The secret never enters a store.
- Started by torch's own rendezvous (torchrun, mp.spawn with ``tcp://``, ``file://``,
  ``store=``), the process has no secret. Rank 0 then makes the world's root info (which holds a
  fresh random secret, ``hccl.get_root_info``) and puts it in the Store torch handed the
  backend; the others read it there and join (``world_from_store``). The job is then exactly
  as private as that Store: whoever can read it can join the job, as with gloo.
"""
from __future__ import annotations

import datetime
import importlib
import itertools

import torch.distributed as dist

from ..comm import Comm
from ..errors import InvalidArgumentError
from .. import config
from ..init import comm_init_root_info, get_root_info, init_comm
from ..store import StoreClient, StoreTimeout

DEFAULT_TIMEOUT = dist.constants.default_pg_timeout
ROOT_INFO_KEY = "npusim/hccl_root_info"

_stores: list = []


def in_npusim_job() -> bool:
    """True under npurun / launcher.spawn (the job secret is in the environment)."""
    return config.job_secret() is not None


def world_comm(store, rank: int, size: int, timeout: datetime.timedelta) -> Comm:
    """The world communicator: npurun's (from its environment) or one built through ``store``."""
    if in_npusim_job():
        return init_comm()
    if store is None:
        raise InvalidArgumentError("init_process_group(backend='hccl'): no store and no npusim job "
                                   "environment; pass init_method='tcp://...', 'file://...', "
                                   "store=..., or start the job with npurun or torchrun")
    return world_from_store(store, rank, size, timeout)


def world_from_store(store, rank: int, size: int, timeout: datetime.timedelta) -> Comm:
    """Rank 0 puts the root info (with a fresh job secret) into torch's ``store``; every rank
    then joins the world with it."""
    if rank == 0:
        store.set(ROOT_INFO_KEY, get_root_info())
    try:
        store.wait([ROOT_INFO_KEY], timeout)
    except (RuntimeError, dist.DistStoreError) as e:     # torch's stores raise both kinds
        raise InvalidArgumentError(f"init_process_group(backend='hccl'): rank 0 did not publish "
                                   f"the communicator's root info within {timeout}: {e}") from None
    return comm_init_root_info(size, bytes(store.get(ROOT_INFO_KEY)), rank)


class JobStore(dist.Store):
    """torch's Store API over npusim's authenticated job store (keys under ``prefix``)."""

    def __init__(self, client: StoreClient, prefix: str):
        super().__init__()
        self._c, self._prefix = client, prefix
        self._timeout = client.timeout
        # torch keeps only the C++ half alive; without the Python half the methods are gone
        _stores.append(self)

    def clone(self):
        twin = JobStore(self._c, self._prefix)     # the client is thread-safe: share it
        twin._timeout = self._timeout
        return twin

    def set_timeout(self, timeout):
        self._timeout = max(timeout.total_seconds(), 1.0)

    def _k(self, key: str) -> str:
        return self._prefix + key

    def set(self, key, value):
        self._c.set(self._k(key), value)

    def get(self, key):
        try:
            return self._c.get(self._k(key), timeout=self._timeout)
        except StoreTimeout as e:
            raise dist.DistStoreError(f"npusim store: key {key!r} not set within "
                                      f"{self._timeout:g} s") from e

    def add(self, key, amount):
        return self._c.add(self._k(key), int(amount))

    def compare_set(self, key, expected, desired):
        return self._c.compare_set(self._k(key), expected, desired)

    def wait(self, keys, timeout=None):
        t = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else self._timeout
        try:
            self._c.wait([self._k(k) for k in keys], timeout=t)
        except StoreTimeout as e:
            raise dist.DistStoreError(f"npusim store: keys {sorted(e.missing)} not set") from e

    def check(self, keys):
        return self._c.check([self._k(k) for k in keys])

    def delete_key(self, key):
        return self._c.delete(self._k(key))


_rdzv = importlib.import_module("torch.distributed.rendezvous")
_torch_env_handler = _rdzv._rendezvous_handlers["env"]
_rdzv_calls = itertools.count(1)


def _env_handler(url: str, timeout=DEFAULT_TIMEOUT, **kwargs):
    secret = config.job_secret()
    if secret is None:        # not an npusim job: torch's own env:// (its TCPStore)
        yield from _torch_env_handler(url, timeout, **kwargs)
        return
    env = config.launcher_vars()   # the set ones, each checked by its table's rule
    try:
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"env:// rendezvous in an npusim job: {e} missing or not an integer "
                         "(npurun and launcher.spawn set RANK, WORLD_SIZE, MASTER_ADDR, "
                         "MASTER_PORT)") from None
    client = StoreClient(host, port, secret, timeout=max(timeout.total_seconds(), 1.0))
    job = config.job()
    yield (JobStore(client, f"torch/{job.job_id}/{job.attempt}/{next(_rdzv_calls)}/"), rank,
           world_size)
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def install() -> None:
    """Route torch's ``env://`` to npusim's job store inside npusim jobs (torch's own outside)."""
    _rdzv._rendezvous_handlers["env"] = _env_handler
