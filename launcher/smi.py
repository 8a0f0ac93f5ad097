"""``npusim-smi``: what holds this machine's simulated cards, shaped like ``npu-smi info``.

``npusim-smi info`` prints a table per device (name, health, HBM used / total) and then the
processes holding each device's HBM (pid, process name, MiB, job and rank), as ``npu-smi info``
prints its NPU and process tables; ``npusim-smi info -l`` lists each device's properties one
per line, as ``npu-smi info -l`` does. The numbers come from the cards' ledgers
(runtime/card.py), which every process that uses a device keeps up to date whenever its pool
reserves or releases memory, so they are right with or without a job running; a process that
died is not listed (its bytes are the card's again).

Which cards: this machine's (node 0, and NPUSIM_CARD_DIR when set, as the processes to look at
had it). A job that simulates several nodes on this machine gives node 1.. cards of their own;
those are listed after node 0's while some process holds them.
"""
from __future__ import annotations

import argparse
import os
import sys

from runtime import config
from runtime.memory import card
from runtime.acl import SOC_NAME

MiB = 1 << 20
W = 98                          # table width, as npu-smi's


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _who(h: card.Holder) -> str:
    if h.rank is None and h.job == config.LOCAL_JOB:
        return "-"
    return f"{h.job}" + ("" if h.rank is None else f" / rank {h.rank}")


def read(directory: str | None = None) -> list[dict]:
    """One record per (node, device): ``node``, ``device``, ``total`` bytes, ``used`` bytes and
    ``holders`` (``card.Holder``, with the process name in ``name``); node 0's devices always,
    other nodes' only while a process holds one of their devices."""
    count = config.device_count()
    default_total = config.hbm_bytes()
    out = []
    for node in card.nodes(directory):
        rows = []
        for dev in range(count):
            holders = card.survey(dev, node=node, directory=directory)
            caps = {h.capacity for h in holders}
            total = max(caps) if caps else default_total
            rows.append({"node": node, "device": dev, "total": total,
                         "used": sum(h.reserved for h in holders),
                         "disagree": len(caps) > 1,
                         "holders": [(h, _proc_name(h.pid)) for h in holders]})
        if node == 0 or any(r["holders"] for r in rows):
            out += rows
    return out


def _line(*cells: tuple) -> str:
    """``| a | b | c |`` with each cell (text, width)."""
    return "|" + "|".join(f" {t:<{w - 1}}" for t, w in cells) + "|"


def _sep(ch: str = "-") -> str:
    return "+" + "+".join(ch * w for w in (27, 15, 54)) + "+"


def info(directory: str | None = None) -> list[str]:
    """The lines of ``npusim-smi info``."""
    cards = read(directory)
    lines = ["+" + "-" * W + "+",
             _line((f"npusim-smi (simulated {SOC_NAME})", 50),
                   (f"card ledgers: {directory or card.ledger_dir()}", W - 49)),
             _sep(),
             _line(("NPU   Name", 27), ("Health", 15), ("Power(W)    Temp(C)", 54)),
             _line(("Chip  Node", 27), ("Bus-Id", 15), ("AICore(%)   HBM-Usage(MB)", 54)),
             _sep("=")]
    for c in cards:
        used, total = c["used"] // MiB, c["total"] // MiB
        note = "  (holders disagree on the size)" if c["disagree"] else ""
        lines += [_line((f"{c['device']:<5} {SOC_NAME}", 27), ("OK", 15), ("-           -", 54)),
                  _line((f"0     {c['node']}", 27), (f"0000:{c['device']:02X}:00.0", 15),
                        (f"-           {used:>6} / {total:<6}{note}", 54)),
                  _sep("=")]
    lines += ["", _sep(),
              _line(("NPU     Chip      Node", 27), ("Process id", 15),
                    ("Process name    | Memory(MB) | Job / rank", 54)),
              _sep("=")]
    for c in cards:
        if not c["holders"]:
            where = f"NPU {c['device']}" + (f" of node {c['node']}" if c["node"] else "")
            lines.append("| " + f"No running processes found in {where}".ljust(W - 1) + "|")
            continue
        for h, name in c["holders"]:
            lines.append(_line((f"{c['device']:<7} 0         {c['node']}", 27),
                               (str(h.pid), 15),
                               (f"{name[:15]:<15} | {h.reserved // MiB:>10} | {_who(h)}", 54)))
    lines.append(_sep("="))
    return lines


def info_list(directory: str | None = None) -> list[str]:
    """The lines of ``npusim-smi info -l``."""
    cards = read(directory)
    lines = [f"\tTotal Count                    : {len(cards)}", ""]
    for c in cards:
        lines += [f"\tNPU ID                         : {c['device']}",
                  f"\tNode                           : {c['node']}",
                  f"\tProduct Name                   : {SOC_NAME} (npusim)",
                  f"\tChip Count                     : 1",
                  f"\tHBM Capacity(MB)               : {c['total'] // MiB}",
                  f"\tHBM Usage(MB)                  : {c['used'] // MiB}",
                  f"\tProcess Count                  : {len(c['holders'])}", ""]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="npusim-smi", description="What holds this machine's simulated NPUs (npu-smi's "
        "view of npusim's cards: HBM used / total and the processes holding it).")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("info", help="devices and the processes holding their HBM")
    i.add_argument("-l", action="store_true", help="list each device's properties")
    i.add_argument("--dir", default=None, help="the card ledger directory (default: "
                   "NPUSIM_CARD_DIR, else /dev/shm/npusim.cards.<uid>)")
    args = p.parse_args(argv)
    try:
        lines = info_list(args.dir) if args.l else info(args.dir)
    except (OSError, ValueError, card.CardLedgerError) as e:
        print(f"npusim-smi: {e}", file=sys.stderr)
        return 1
    try:
        print("\n".join(lines))
    except BrokenPipeError:          # `npusim-smi info | head`: the reader has gone
        sys.stdout = None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
