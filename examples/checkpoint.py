"""Atomic training checkpoints for the examples: each one is complete or absent, never half.

A checkpoint directory holds, per saved step, two files:

    step-00000040.npz     the payload: parameters, optimizer state and the step, in the
                          example's own format (numpy .npz, or torch.save for the torch example)
    step-00000040.json    its manifest: step, world size, parameter shapes, payload size and sha256

Who writes: rank 0 only. Data-parallel replicas hold bitwise-identical parameters and optimizer
state, so one copy is the job's state; rank 0 also reads it back on a restart and broadcasts it,
as it broadcasts the initial parameters. No other rank opens the directory, so nothing races the
writer, and the directory may be local to rank 0's node.

Writing (``save``): the payload goes to a temporary file, is fsynced and renamed to its name;
then the manifest the same way; then the directory is fsynced so that the renames last. A
checkpoint counts once its manifest exists, so a writer killed at any point leaves the previous
checkpoints as they were and at worst a temporary file or a payload without manifest, which the
next ``save`` removes. Only the newest ``keep`` checkpoints stay.

Reading (``latest``), newest manifest first:
- bad input (a manifest that does not parse, a payload that is missing, truncated, longer than
  the manifest says, with another sha256, or that does not load) is refused with a message
  naming the file and why, and the next older checkpoint is tried: a crash or a bad disk
  damaged one file, and the older state is a valid continuation;
- a checkpoint of another world size or model shape raises ``CheckpointMismatch`` with the
  numbers and stops the job, as torch's DCP refuses mismatches: the older checkpoints of that
  directory come from the same other job, and starting from step 0 instead would overwrite them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

MANIFEST_FORMAT = 1
DEFAULT_EVERY = 20
_MANIFEST = re.compile(r"^step-(\d{8})\.json$")


class CheckpointMismatch(RuntimeError):
    """The newest complete checkpoint belongs to a job of another world size or model shape."""


@dataclass
class Loaded:
    step: int
    path: str          # the payload file
    state: Any         # what ``parse`` made of the payload


def add_arguments(parser) -> None:
    """The examples' ``--checkpoint-dir`` and ``--checkpoint-every`` flags."""
    parser.add_argument("--checkpoint-dir", metavar="DIR",
                        help="rank 0 checkpoints the training state into DIR; a run resumes "
                             "from the newest complete checkpoint there")
    parser.add_argument("--checkpoint-every", type=int, metavar="N",
                        help=f"steps between checkpoints (default {DEFAULT_EVERY} with "
                             f"--checkpoint-dir)")


def check_arguments(parser, args) -> None:
    """After ``parse_args``: the default of --checkpoint-every, and its errors."""
    if args.checkpoint_every is not None and not args.checkpoint_dir:
        parser.error("--checkpoint-every needs --checkpoint-dir")
    if args.checkpoint_every is None:
        args.checkpoint_every = DEFAULT_EVERY
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint-every must be positive, not {args.checkpoint_every}")


def _name(step: int, suffix: str) -> str:
    return f"step-{step:08d}{suffix}"


def _write_durably(path: str, data: bytes) -> None:
    """Write ``data`` to a temporary file, fsync it, rename it to ``path``.

    os.write is unbuffered, so there is nothing to flush before the fsync.
    """
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _steps(directory: str) -> list[int]:
    """Steps that have a manifest, newest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)) for m in map(_MANIFEST.match, names) if m), reverse=True)


def save(directory: str, step: int, payload: bytes, suffix: str, meta: dict,
         keep: int = 3) -> str:
    """Write checkpoint ``step`` atomically; return its payload path (rank 0 only).

    ``meta`` holds what a resuming job must match (``world_size``, ``shapes``); ``suffix`` is
    the payload's file extension. Older checkpoints beyond the newest ``keep`` are removed.
    """
    os.makedirs(directory, exist_ok=True)
    payload_path = os.path.join(directory, _name(step, suffix))
    manifest_path = os.path.join(directory, _name(step, ".json"))
    _unlink(manifest_path)     # rewriting a step: it is absent, never old manifest + new payload
    _write_durably(payload_path, payload)
    manifest = {"format": MANIFEST_FORMAT, "step": step, "payload": os.path.basename(payload_path),
                "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(), **meta}
    _write_durably(manifest_path, json.dumps(manifest, indent=1).encode())
    _fsync_dir(directory)
    _prune(directory, keep)
    return payload_path


def _prune(directory: str, keep: int) -> None:
    """Remove checkpoints beyond the newest ``keep``, and what killed writers left behind."""
    steps = _steps(directory)
    kept = set(steps[:keep])
    for step in steps[keep:]:
        _unlink(os.path.join(directory, _name(step, ".json")))   # absent first, then the rest
    for name in os.listdir(directory):
        m = re.match(r"^\.?step-(\d{8})\.", name)
        if m and (name.startswith(".") or int(m.group(1)) not in kept):
            _unlink(os.path.join(directory, name))


def _refuse(path: str, why: str) -> None:
    print(f"checkpoint {path} refused: {why}; trying an older one", file=sys.stderr, flush=True)


def _check_match(manifest_path: str, manifest: dict, meta: dict) -> None:
    world, want = manifest.get("world_size"), meta["world_size"]
    if world != want:
        raise CheckpointMismatch(
            f"checkpoint {manifest_path} was written by a job of {world} ranks, this job has "
            f"{want}: resume it with {world} ranks, or give another --checkpoint-dir")
    theirs, ours = manifest.get("shapes") or {}, meta["shapes"]
    for name in sorted(set(theirs) | set(ours)):
        if theirs.get(name) != ours.get(name):
            raise CheckpointMismatch(
                f"checkpoint {manifest_path}: parameter {name!r} has shape {theirs.get(name)} "
                f"there and {ours.get(name)} in this model (another --hidden?): give another "
                f"--checkpoint-dir, or the model options of the run that wrote it")


def latest(directory: str, meta: dict, parse: Callable[[bytes], Any]) -> Loaded | None:
    """The newest intact checkpoint of ``directory`` (None if there is none).

    ``parse(payload_bytes)`` makes the state; anything it raises marks the payload corrupt.
    Raises CheckpointMismatch if the newest intact checkpoint does not fit ``meta``.
    """
    for step in _steps(directory):
        manifest_path = os.path.join(directory, _name(step, ".json"))
        try:
            with open(manifest_path, "rb") as f:
                manifest = json.loads(f.read())
            payload_path = os.path.join(directory, manifest["payload"])
            size, digest = int(manifest["bytes"]), str(manifest["sha256"])
            if manifest.get("step") != step or os.path.basename(payload_path) != \
                    manifest["payload"]:
                raise ValueError("step or payload name differs from the file name")
        except FileNotFoundError:
            continue                  # pruned by a writer meanwhile
        except (ValueError, KeyError, TypeError) as e:
            _refuse(manifest_path, f"corrupt manifest ({e})")
            continue
        try:
            with open(payload_path, "rb") as f:
                data = f.read(size + 1)
        except FileNotFoundError:
            _refuse(payload_path, "missing (its manifest exists)")
            continue
        if len(data) != size:
            _refuse(payload_path, f"truncated: {len(data)} of {size} bytes" if len(data) < size
                    else f"longer than the {size} bytes its manifest gives")
            continue
        if hashlib.sha256(data).hexdigest() != digest:
            _refuse(payload_path, f"corrupt: its sha256 differs from the manifest's {digest[:16]}...")
            continue
        _check_match(manifest_path, manifest, meta)
        try:
            state = parse(data)
        except Exception as e:       # any failure to load is damage, whatever the library raises
            _refuse(payload_path, f"corrupt: does not load ({type(e).__name__}: {e})")
            continue
        return Loaded(step, payload_path, state)
    return None
