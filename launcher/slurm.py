"""SLURM integration: defaults for --nnodes / --node-rank / --master-addr under ``srun npurun``.

SLURM compresses host lists (``node[01-04]``, ``a[1,3-5],b2``, ``n[001-002]-ib``,
``r[1-2]n[1-2]``); ``parse_nodelist`` expands them without calling ``scontrol``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping

from launcher.errors import ConfigError


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"nested '[' in SLURM host list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"unbalanced ']' in SLURM host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"unbalanced '[' in SLURM host list {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(body: str, whole: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise ConfigError(f"empty range in SLURM host list {whole!r}")
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ConfigError(f"bad range {item!r} in SLURM host list {whole!r}")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ConfigError(f"descending range {item!r} in SLURM host list {whole!r}")
        width = len(lo)  # node[001-010]: zero padding follows the first bound
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


def _expand_item(item: str, whole: str) -> list[str]:
    pieces: list[list[str]] = []
    pos = 0
    while pos < len(item):
        open_ = item.find("[", pos)
        if open_ < 0:
            pieces.append([item[pos:]])
            break
        if open_ > pos:
            pieces.append([item[pos:open_]])
        close = item.index("]", open_)
        pieces.append(_expand_ranges(item[open_ + 1:close], whole))
        pos = close + 1
    return ["".join(combo) for combo in itertools.product(*pieces)]


def parse_nodelist(text: str) -> list[str]:
    """Expand a SLURM host list into host names, in order.

    >>> parse_nodelist("a[1,3-5],b2")
    ['a1', 'a3', 'a4', 'a5', 'b2']

    Raises ConfigError for malformed lists.
    """
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        hosts.extend(_expand_item(item, text))
    if not hosts:
        raise ConfigError(f"empty SLURM host list {text!r}")
    return hosts


@dataclass(frozen=True)
class SlurmDefaults:
    """What npurun derives from a SLURM step's environment."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    job_id: str
    step_id: str = ""

    @property
    def run_id(self) -> str:
        """The default run id (TORCHELASTIC_RUN_ID, the log directory's name): the SLURM job and
        step, ``slurm-1234.0``; empty without a job id."""
        if not self.job_id:
            return ""
        return f"slurm-{self.job_id}" + (f".{self.step_id}" if self.step_id else "")


def defaults(environ: Mapping[str, str]) -> SlurmDefaults | None:
    """Defaults from SLURM_NNODES / SLURM_NODEID / SLURM_JOB_NODELIST, or None outside SLURM.

    The port is 20000 + SLURM_JOB_ID % 20000, so two jobs sharing a node do not collide.
    Raises ConfigError when srun started more than one npurun on a node (run one per node).
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    nnodes = environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES")
    node_id = environ.get("SLURM_NODEID")
    if not (nodelist and nnodes and node_id):
        return None
    local_id = environ.get("SLURM_LOCALID", "0")
    if local_id not in ("", "0"):
        raise ConfigError(
            f"srun started several npurun on this node (SLURM_LOCALID={local_id}); npurun starts "
            f"the node's ranks itself: use `srun --ntasks-per-node=1 npurun --nproc-per-node N ...`")
    try:
        n, rank = int(nnodes), int(node_id)
    except ValueError:
        raise ConfigError(f"SLURM_NNODES={nnodes!r} / SLURM_NODEID={node_id!r} are not "
                          f"integers") from None
    hosts = parse_nodelist(nodelist)
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""
    port = 20000 + (int(job_id) % 20000 if job_id.isdigit() else 9500)
    step_id = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or ""
    return SlurmDefaults(nnodes=n, node_rank=rank, master_addr=hosts[0], master_port=port,
                         job_id=job_id, step_id=step_id)
