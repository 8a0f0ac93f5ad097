"""Logging for npusim packages, level from ASCEND_GLOBAL_LOG_LEVEL (0 debug .. 3 error)."""
from __future__ import annotations

import logging

from . import config

# ASCEND_GLOBAL_LOG_LEVEL -> logging level; 4 is "off": above every level a record can have
LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR,
          4: logging.CRITICAL + 10}


def setup(name: str) -> logging.Logger:
    """Configure logger ``name`` once: level from the environment, one stderr handler."""
    logger = logging.getLogger(name)
    try:
        level = LEVELS[config.log_level()]
    except ValueError:          # a bad value must not stop the program: the default level
        level = logging.ERROR
    logger.setLevel(level)
    if not any(getattr(h, "_npusim", False) for h in logger.handlers):
        h = logging.StreamHandler()
        h._npusim = True
        try:
            rank = config.rank()
        except ValueError:
            rank = None
        tag = f"rank {rank} " if rank is not None else ""
        h.setFormatter(logging.Formatter(f"[npusim {tag}%(levelname)s %(name)s] %(message)s"))
        logger.addHandler(h)
        logger.propagate = False
    return logger


def is_ours(handler: logging.Handler) -> bool:
    """Whether ``handler`` is the one ``setup`` installed (launcher.forkserver sets the loggers
    up again in each forked rank: the tag carries the rank)."""
    return bool(getattr(handler, "_npusim", False))
