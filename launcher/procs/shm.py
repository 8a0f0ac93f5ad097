"""The job's shared-memory segments: ``/dev/shm/npusim-<job_id>-*``, removed at the job's end."""
from __future__ import annotations

import glob
import logging
import os
import re
import secrets

log = logging.getLogger("launcher")

SHM_DIR = "/dev/shm"
_JOB_ID = re.compile(r"^[A-Za-z0-9_.]+$")


def new_job_id() -> str:
    """A fresh job id: 12 hex digits, safe in file names and globs."""
    return secrets.token_hex(6)


def check_job_id(job_id: str) -> str:
    """Return ``job_id`` if it is safe in a file name and a glob; raise ValueError otherwise."""
    if not _JOB_ID.match(job_id or ""):
        raise ValueError(f"job id {job_id!r} must be letters, digits, '_' or '.'")
    return job_id


def segments(job_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Paths of the job's segments that exist now."""
    return sorted(glob.glob(os.path.join(shm_dir, f"npusim-{check_job_id(job_id)}-*")))


def remove_segments(job_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every segment of the job; return the paths removed (already-gone ones skipped)."""
    removed = []
    for path in segments(job_id, shm_dir):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("npurun: cannot remove shared-memory segment %s: %s", path, e)
    if removed:
        log.info("npurun: removed %d shared-memory segment(s) of job %s", len(removed), job_id)
    return removed
