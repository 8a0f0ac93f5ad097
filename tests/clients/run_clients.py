"""Public clients on simulated NPUs vs the same scripts on CPU + gloo (tests/clients/SOURCES.md).

    PYTHONPATH=$PWD python tests/clients/run_clients.py --sources DIR [--world 2] [--client N]

The public scripts are not in this repository (we do not redistribute them): DIR (or the
environment variable NPUSIM_CLIENT_SOURCES) holds plain ``git clone``s of their repositories as
DIR/<owner>/<repo>, checked out at the commits in REPOS. Each file a client needs is read from
there, its git blob id checked against BLOBS (the one table of them), and copied into the run's
temporary directory; a missing or different file is an error naming the commands to fix it.

Each client is a public script, byte for byte as upstream's. It runs twice per world size (three
times past world 2):

- **npu**: ``npurun --nproc-per-node W`` on npusim's simulated NPUs. A CUDA script gets the one
  documented edit, ``from torch_npu.contrib import transfer_to_npu`` on the line after its
  ``import torch`` (``npu_variant`` writes that copy; SOURCES.md shows the diff); a script
  written for any accelerator (``torch.accelerator``) can get ``import torch_npu`` there
  instead ("ddp-example-import"); a torch_npu script runs as it is ("shufflenetv2-npu":
  Ascend/ModelZoo-PyTorch's ShuffleNetV2_iflytek main.py, on its ``--dummy`` data).
- **ref**: ``python -m torch.distributed.run --standalone --nproc-per-node W`` (torchrun) on CPU
  tensors with gloo: the file itself, with ref_shim mapping cuda/accelerator/npu to CPU
  and nccl/hccl to gloo for this run only.
- **ref-hccl** (worlds > 2): the same, under npurun with npusim's "hccl" on the CPU tensors in
  gloo's place. gloo's ring adds three or more ranks' values in another order than hccl's
  (x0 + x1) + x2, so past world 2 the bitwise reference is this one (docs/torch.md).

Both go through client_runner.py, which seeds torch with 1234 + RANK (the clients seed nothing),
records the losses (every scalar ``backward()``) and the final parameters and buffers of every
DDP-wrapped module, and any checkpoint the client wrote. ``compare`` asserts they are equal
bit for bit, rank by rank. Both runs get OMP_NUM_THREADS=1 (torchrun's default for W > 1).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUNNER = os.path.join(HERE, "client_runner.py")
EDIT = "from torch_npu.contrib import transfer_to_npu"
IMPORT = "import torch_npu"       # torch_npu's own one line, for a script written for any accelerator

SOURCES_ENV = "NPUSIM_CLIENT_SOURCES"

# The upstream repositories and the commits the comparison was measured at.
REPOS = {
    "pytorch/examples": "77f55b912142e11fcfdf5b530231fb9c52f181e8",
    "Ascend/ModelZoo-PyTorch": "6a2804a358a5b18e3dac1ab902f41f88e240b00f",
}
SHUFFLENET = "PyTorch/dev/perf/ShuffleNetV2_iflytek_for_Pytorch"
# (repository, path) -> git blob id at REPOS' commit: every file a client runs, checked before
# it runs (a different byte would make the comparison a comparison of something else).
BLOBS = {
    ("pytorch/examples", "distributed/ddp/example.py"):
        "d64b4739769e3c36cc5522605edd43582895b59b",
    ("pytorch/examples", "distributed/ddp-tutorial-series/multigpu_torchrun.py"):
        "32d6254d2dc43b104655bb7aec41a00b492e8dc4",
    ("pytorch/examples", "distributed/ddp-tutorial-series/datautils.py"):
        "22c364eaa0d36bdcb5726f9f23972fe6b5d50615",
    ("Ascend/ModelZoo-PyTorch", f"{SHUFFLENET}/main.py"):
        "c63e24195b78f2930b1a1c37984900f58b7b140f",
    ("Ascend/ModelZoo-PyTorch", f"{SHUFFLENET}/models/__init__.py"):
        "aa248948861941567c7fdcf5d54f14178df34692",
    ("Ascend/ModelZoo-PyTorch", f"{SHUFFLENET}/models/shufflenetv2.py"):
        "82e86f14472ea523ff505b5980b6747051116d22",
    ("Ascend/ModelZoo-PyTorch", f"{SHUFFLENET}/models/utils.py"):
        "abd4ee3f7333b677f04f942f919b73c187ebfd60",
}

# name -> its repository and folder, the files it needs there (relative to the folder, the
# script first), what it runs, the edit it gets, what else to record.
# "runs": the script's argument lists, run one after the other in one working directory (the
# tutorial's second run resumes from the snapshot the first one saved). "edit": None for a
# torch_npu script (it runs unchanged). "max_steps": client_runner ends the script at that many
# optimizer steps (its only size knob is the data set). "needs": modules it imports beyond torch.
_DDP = dict(repo="pytorch/examples", dir="distributed/ddp", files=["example.py"])
_TUTORIAL = dict(repo="pytorch/examples", dir="distributed/ddp-tutorial-series",
                 files=["multigpu_torchrun.py", "datautils.py"])
CLIENTS = {
    "ddp-example": dict(**_DDP, edit=EDIT, runs=[[]], collect=[]),
    "ddp-example-import": dict(**_DDP, edit=IMPORT, runs=[[]], collect=[]),
    "ddp-tutorial": dict(
        **_TUTORIAL, edit=EDIT, runs=[["2", "1", "--batch_size", "32"]], collect=["snapshot.pt"]),
    "ddp-tutorial-resume": dict(
        **_TUTORIAL, edit=EDIT,
        runs=[["1", "1", "--batch_size", "64"], ["2", "1", "--batch_size", "64"]],
        collect=["snapshot.pt"]),
    # torchrun-style start (env://, WORLD_SIZE / RANK), not its 8p scripts' mp.spawn; -j 0: the
    # FakeData images are made in the rank itself; batch 4 per rank; 3 steps
    "shufflenetv2-npu": dict(
        repo="Ascend/ModelZoo-PyTorch", dir=SHUFFLENET,
        files=["main.py", "models/__init__.py", "models/shufflenetv2.py", "models/utils.py"],
        edit=None,
        runs=[["--dummy", "-a", "shufflenet_v2_x0_5", "--dist-url", "env://", "-b", "4",
               "-j", "0", "--epochs", "1", "-p", "1"]],
        collect=[], max_steps=3, needs=["torchvision", "PIL"]),
}


class SourcesError(RuntimeError):
    """The public scripts are missing from the sources root or are not the recorded bytes."""


def git_blob(data: bytes) -> str:
    """The git blob id of ``data`` (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def get_commands(root: str, repo: str) -> str:
    """The shell commands that put ``repo`` at its recorded commit under ``root``."""
    dest = os.path.join(root, *repo.split("/"))
    return (f"git clone https://github.com/{repo}.git {dest} && "
            f"git -C {dest} checkout {REPOS[repo]}")


def sources_root(root: str | None = None) -> str:
    """``root``, else $NPUSIM_CLIENT_SOURCES; SourcesError (with the clone commands) when unset
    or not a directory."""
    given = root if root is not None else os.environ.get(SOURCES_ENV, "")
    if not given or not os.path.isdir(given):
        what = (f"sources root {given!r} is not a directory" if given else
                f"no sources root: pass --sources DIR or set {SOURCES_ENV}=DIR")
        shown = given or "DIR"
        raise SourcesError(
            f"{what}; the public clients are not in this repository: get them with\n  "
            + "\n  ".join(get_commands(shown, r) for r in REPOS))
    return given


def client_files(name: str, root: str | None = None) -> dict[str, bytes]:
    """The bytes of every file client ``name`` needs (relative to its folder), read from the
    sources root and checked against BLOBS; SourcesError naming the file and the fix otherwise."""
    c = CLIENTS[name]
    base = sources_root(root)
    out = {}
    for rel in c["files"]:
        upath = f"{c['dir']}/{rel}"
        path = os.path.join(base, *c["repo"].split("/"), *upath.split("/"))
        if not os.path.isfile(path):
            clone = os.path.join(base, *c["repo"].split("/"))
            fix = (f"git -C {clone} checkout {REPOS[c['repo']]}" if os.path.isdir(clone)
                   else get_commands(base, c["repo"]))
            raise SourcesError(
                f"{name}: {path} is missing (the sources root {base} holds no {c['repo']} at "
                f"{REPOS[c['repo']]}); get it with\n  {fix}")
        with open(path, "rb") as f:
            data = f.read()
        want, found = BLOBS[(c["repo"], upath)], git_blob(data)
        if found != want:
            raise SourcesError(
                f"{name}: {path} has git blob {found}, expected {want} ({c['repo']} "
                f"{upath} at commit {REPOS[c['repo']]}); check that commit out: "
                f"git -C {os.path.join(base, *c['repo'].split('/'))} checkout {REPOS[c['repo']]}")
        out[rel] = data
    return out


def unavailable(name: str, root: str | None = None) -> str:
    """Why client ``name`` cannot run here ('' when it can): its sources or a module it needs."""
    try:
        client_files(name, root)
    except SourcesError as e:
        return str(e)
    return missing(name)


def missing(name: str) -> str:
    """Why client ``name`` cannot run here ('' when it can): a module it needs does not import."""
    import importlib.util
    for mod in CLIENTS[name].get("needs", []):
        if mod == "torchvision":
            sys.path.insert(0, HERE)
            try:
                import tv_compat
            finally:
                sys.path.remove(HERE)
            why = tv_compat.available()
            if why:
                return (f"{why} (pip install torchvision==0.28.0, torch 2.13's: it adds "
                        "Pillow and keeps torch)")
        elif importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    return ""


def npu_variant(text: str, line: str = EDIT) -> str:
    """``text`` with ``line`` inserted after its first ``import torch`` line: the one edit."""
    lines = text.splitlines(keepends=True)
    for i, ln in enumerate(lines):
        if ln.rstrip("\r\n") == "import torch":
            eol = ln[len(ln.rstrip("\r\n")):] or "\n"
            return "".join(lines[:i + 1] + [line + eol] + lines[i + 1:])
    raise ValueError("no 'import torch' line to put the transfer_to_npu line after")


def prepare(name: str, mode: str, work: str, root: str | None = None) -> str:
    """Copy client ``name``'s checked files from the sources root into ``work``/src; for the npu
    run, apply its edit. Its script path."""
    c = CLIENTS[name]
    src = os.path.join(work, "src")
    for rel, data in client_files(name, root).items():
        path = os.path.join(src, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if mode == "npu" and c["edit"] and rel == c["files"][0]:
            data = npu_variant(data.decode("utf-8"), c["edit"]).encode("utf-8")
        with open(path, "wb") as f:
            f.write(data)
    return os.path.join(src, c["files"][0])


def command(mode: str, world: int, script: str, out: str, args: list[str],
            collect: list[str], max_steps: int | None = None) -> list[str]:
    launch = ([sys.executable, "-m", "launcher", "--nproc-per-node", str(world)]
              if mode in ("npu", "ref-hccl")
              else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(world)])
    extra = [x for c in collect for x in ("--collect", c)]
    if max_steps is not None:
        extra += ["--max-steps", str(max_steps)]
    return [*launch, RUNNER, "--mode", mode, "--out", out, *extra, script, "--", *args]


def environment(base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ROOT not in parts:
        parts.insert(0, ROOT)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("NPUSIM_TORCH_NPU", None)
    return env


class ClientRun:
    """One client, one mode, one world: its per-run, per-rank records and wall times."""

    def __init__(self, name, mode, world, records, seconds, outputs):
        self.name, self.mode, self.world = name, mode, world
        self.records = records      # [run][rank] -> {"losses", "state", "files"}
        self.seconds = seconds      # [run] wall seconds, launcher start to exit
        self.outputs = outputs      # [run] (stdout, stderr)


def run(name: str, mode: str, world: int, work: str, env: dict | None = None,
        timeout: float = 300, sources: str | None = None) -> ClientRun:
    """Run client ``name`` in ``mode`` ('npu', 'ref' or 'ref-hccl') at ``world`` ranks under
    ``work``, from the sources root ``sources`` (default: $NPUSIM_CLIENT_SOURCES)."""
    import torch
    c = CLIENTS[name]
    os.makedirs(work, exist_ok=True)
    script = prepare(name, mode, work, sources)
    cwd = os.path.join(work, "cwd")
    os.makedirs(cwd)
    records, seconds, outputs = [], [], []
    for i, args in enumerate(c["runs"]):
        out = os.path.join(work, f"out{i}")
        cmd = command(mode, world, script, out, args, c["collect"], c.get("max_steps"))
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=cwd, env=environment(env), capture_output=True, text=True,
                           timeout=timeout)
        seconds.append(time.perf_counter() - t0)
        outputs.append((p.stdout, p.stderr))
        if p.returncode != 0 and not gloo_exit_abort(mode, p.stderr, out, world):
            raise RuntimeError(f"{name} ({mode}, world {world}, run {i}: {' '.join(args)}) "
                               f"exited {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n"
                               f"--- stderr\n{p.stderr[-6000:]}")
        records.append([torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False)
                        for r in range(world)])
    return ClientRun(name, mode, world, records, seconds, outputs)


GLOO_EXIT_ABORT = "terminate called without an active exception"


def gloo_exit_abort(mode: str, stderr: str, out: str, world: int) -> bool:
    """Whether a failed run is torch's gloo aborting a rank at interpreter exit after the
    script finished: torch 2.13's gloo does so now and then (SIGABRT, "terminate called
    without an active exception", after ``destroy_process_group``; 2 of about 13 reference
    runs of ddp-example on 2026-12-04). The reference run is torch's code, not npusim's, so
    such a run counts when every rank wrote its record (client_runner writes it after the
    script returned), with a warning; an npu or ref-hccl run never does."""
    if mode != "ref" or GLOO_EXIT_ABORT not in stderr or \
            not all(os.path.exists(os.path.join(out, f"rank{r}.pt")) for r in range(world)):
        return False
    print(f"run_clients: the CPU + gloo reference aborted at exit after every rank's record "
          f"was written ({GLOO_EXIT_ABORT!r}, torch's gloo): its records are used",
          file=sys.stderr)
    return True


def _bits(t) -> bytes:
    import torch
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _same(a, b, where: str, diffs: list[str]) -> None:
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            diffs.append(f"{where}: {type(a).__name__} vs {type(b).__name__}")
        elif a.dtype != b.dtype or a.shape != b.shape:
            diffs.append(f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
        elif _bits(a) != _bits(b):
            d = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "-"
            diffs.append(f"{where}: values differ (max |diff| {d})")
    elif isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            diffs.append(f"{where}: keys {sorted(a)} vs {sorted(b)}")
        for k in a.keys() & b.keys():
            _same(a[k], b[k], f"{where}.{k}", diffs)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            diffs.append(f"{where}: {len(a)} items vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]", diffs)
    elif a != b:
        diffs.append(f"{where}: {a!r} vs {b!r}")


def compare(npu: ClientRun, ref: ClientRun) -> list[str]:
    """Every difference between the two runs' records (empty: bitwise equal everywhere); not
    their "where" (npu:N and hccl in one, cpu and gloo in the other)."""
    diffs: list[str] = []
    strip = [[[{k: v for k, v in rank.items() if k != "where"} for rank in run_] for run_ in rec]
             for rec in (npu.records, ref.records)]
    _same(strip[0], strip[1], "run", diffs)
    return diffs


def summary(rec_runs) -> str:
    """Steps and the first/last loss of rank 0, from one ClientRun's records."""
    losses = [float(x) for run_ in rec_runs for x in run_[0]["losses"]]
    if not losses:
        return "no losses"
    return f"{len(losses)} losses, first {losses[0]:.6g}, last {losses[-1]:.6g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, action="append", help="world size (repeatable; 2)")
    p.add_argument("--client", action="append", choices=sorted(CLIENTS), help="(all)")
    p.add_argument("--keep", action="store_true", help="keep the working directories")
    p.add_argument("--sources", metavar="DIR", help="where the clients' repositories are cloned, "
                   f"as DIR/<owner>/<repo> (default: ${SOURCES_ENV})")
    a = p.parse_args(argv)
    try:
        sources_root(a.sources)
    except SourcesError as e:
        print(f"run_clients: {e}", file=sys.stderr)
        return 2
    worlds = a.world or [2]
    failed = 0
    base = tempfile.mkdtemp(prefix="npusim-clients-")
    try:
        for name in a.client or list(CLIENTS):
            try:
                client_files(name, a.sources)
            except SourcesError as e:
                print(f"run_clients: {e}", file=sys.stderr)
                return 2
            why = missing(name)
            if why:
                print(f"{name:20s} skipped: {why}", flush=True)
                continue
            for w in worlds:
                modes = ("ref", "npu", "ref-hccl") if w > 2 else ("ref", "npu")
                runs = {m: run(name, m, w, os.path.join(base, f"{name}-{m}-{w}"),
                            sources=a.sources)
                        for m in modes}
                if w > 2:
                    hd = compare(runs["npu"], runs["ref-hccl"])
                    print(f"{name:20s} world {w}: vs CPU + hccl "
                          f"{'EQUAL (bitwise)' if not hd else 'DIFFER'}", flush=True)
                    failed += bool(hd)
                    for d in hd[:20]:
                        print("   ", d)
                diffs = compare(runs["npu"], runs["ref"])
                # past 2 ranks gloo's ring adds in another order than hccl's (x0 + x1) + x2
                # (docs/torch.md): there the bitwise check is against CPU + hccl, above
                failed += bool(diffs) and w == 2
                tn, tr = sum(runs["npu"].seconds), sum(runs["ref"].seconds)
                verdict = ("EQUAL (bitwise)" if not diffs else "DIFFER" if w == 2
                           else f"DIFFER from gloo in {len(diffs)} values (the sum order)")
                print(f"{name:20s} world {w}: {verdict}; "
                      f"{summary(runs['npu'].records)}; npu {tn:.1f} s, cpu+gloo {tr:.1f} s "
                      f"(ratio {tn / tr:.2f})", flush=True)
                for d in diffs[:20]:
                    print("   ", d)
    finally:
        if a.keep:
            print("kept", base)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
