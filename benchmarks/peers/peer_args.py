"""The command-line arguments gloo_bench.py and mpi_bench.py share (compare.py passes both the
same ones)."""

SIZES = "1024,65536,1048576,16777216,67108864"


def add_common(ap, *, colls: str, max_iters: int, json: str) -> None:
    """--sizes, --colls, --target-s, --max-iters and --json, with this peer's defaults."""
    ap.add_argument("--sizes", default=SIZES, help="bytes per call, comma-separated")
    ap.add_argument("--colls", default=colls, help="collectives, comma-separated")
    ap.add_argument("--target-s", type=float, default=1.0, help="seconds of calls per size")
    ap.add_argument("--max-iters", type=int, default=max_iters)
    ap.add_argument("--json", default=json, help="where rank 0 writes the results")


def add_startup(path: str, key: str, seconds: float) -> None:
    """Add ``key`` (a wall time measured by the launching process) to the startup figures rank 0
    wrote to ``path``, and print them."""
    import json
    with open(path) as f:
        d = json.load(f)
    d["startup"][key] = seconds
    with open(path, "w") as f:
        json.dump(d, f, indent=1)
    print("startup:", {k: round(v, 3) for k, v in d["startup"].items()})
