"""Logging for npusim packages, level from ASCEND_GLOBAL_LOG_LEVEL (0 debug .. 3 error)."""
from __future__ import annotations

import logging

from . import config

_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}


def setup(name: str) -> logging.Logger:
    """Configure logger ``name`` once: level from the environment, one stderr handler."""
    logger = logging.getLogger(name)
    try:
        level = _LEVELS.get(config.log_level(), logging.ERROR)
    except ValueError:
        level = logging.ERROR
    logger.setLevel(level)
    if not any(getattr(h, "_npusim", False) for h in logger.handlers):
        h = logging.StreamHandler()
        h._npusim = True
        rank = config.rank()
        tag = f"rank {rank} " if rank is not None else ""
        h.setFormatter(logging.Formatter(f"[npusim {tag}%(levelname)s %(name)s] %(message)s"))
        logger.addHandler(h)
        logger.propagate = False
    return logger
