"""A script that does not compile fails the job once, in npurun, before any rank starts.

Every rank would otherwise print the same SyntaxError (256 of them at world 256) and npurun
would report the first as a rank's failure. Only scripts given by path are compiled here: a
module (``-m``) would need its package imported to be found, which runs the user's code in
npurun; a program (``--no-python``) is not Python.
"""
from __future__ import annotations

import os
import traceback


def script_problem(worker_args: list[str] | None) -> str | None:
    """The SyntaxError of the script in ``launcher.worker``'s arguments, as Python prints it
    (file, line, the line and a caret), or None when it compiles (or is not a script)."""
    if not worker_args or worker_args[0].startswith("-"):
        return None
    path = worker_args[0]
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError:
        return None         # each rank reports it as Python would ("can't open file")
    try:
        compile(source, os.path.abspath(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        return "".join(traceback.format_exception_only(type(e), e)).rstrip()
    return None
