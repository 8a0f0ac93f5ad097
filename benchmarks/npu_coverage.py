"""docs/coverage.md: which names of the real torch_npu npusim has, and which real code uses.

Three steps, each a subcommand; the first two read sources outside this checkout and store what
they found in benchmarks/ (JSON, with where it came from), the third needs only those files:

    python -m benchmarks.npu_coverage wheel torch_npu-2.14.0-cp311-...whl   # or its unzipped dir
        -> benchmarks/npu_coverage_wheel.json: torch_npu's public names per group, read from the
           wheel's Python sources with ``ast`` (no import: no CANN needed)
    python -m benchmarks.npu_coverage usage WHEEL NAME=PATH ...             # git dirs or folders
        -> benchmarks/npu_coverage_usage.json: every torch_npu name those code bases reference
           (``torch_npu.x``, ``torch.npu.x``, ``from torch_npu... import x``), with the bases
           that use each
    python -m benchmarks.npu_coverage page [--write]
        -> docs/coverage.md and docs/coverage.json: each name, whether npusim has it (``yes``;
           ``raises``: present, raising an error that says why it has no meaning here; ``no``),
           whether a test under tests/ exercises it (a grep), per-group counts, and the used
           names with their code bases.

The groups (``wheel``): ``torch.npu`` (``torch_npu.npu.__all__`` and the ``__all__`` of its amp,
random, utils, aclnn and mstx parts, and aclnn's flags), ``transfer_to_npu`` (every attribute its
``_init`` sets, as ``replace``, and every function whose device arguments it rewrites, as
``device args``), ``npu_* operators`` (``torch_npu.utils.exposed_api.public_npu_functions``),
``torch_npu.profiler`` (its ``__all__``) and ``torch_npu.distributed`` (its ``__all__``, the
named dtypes, ProcessGroupHCCL and its Options). tests/torch/test_npu_coverage.py rebuilds the
page from the stored files and npusim's own names and fails when docs/coverage.md differs.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

from benchmarks import ROOT

WHEEL_JSON = os.path.join(ROOT, "benchmarks", "npu_coverage_wheel.json")
USAGE_JSON = os.path.join(ROOT, "benchmarks", "npu_coverage_usage.json")
PAGE = os.path.join(ROOT, "docs", "coverage.md")
PAGE_JSON = os.path.join(ROOT, "docs", "coverage.json")
GROUPS = ("torch.npu", "transfer_to_npu", "npu_* operators", "torch_npu.profiler",
          "torch_npu.distributed")


# ============================================================== the wheel's names (ast only)
def _source_root(path: str) -> str:
    """The directory holding ``torch_npu/`` (a wheel is unzipped, .py files only)."""
    if os.path.isdir(path):
        if os.path.isdir(os.path.join(path, "torch_npu")):
            return path
        raise FileNotFoundError(f"{path} has no torch_npu/ directory")
    out = tempfile.mkdtemp(prefix="npu_coverage_")
    with zipfile.ZipFile(path) as z:
        for n in z.namelist():
            if n.endswith(".py") and n.startswith("torch_npu/"):
                z.extract(n, out)
    return out


def _read(root: str, rel: str) -> ast.Module:
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return ast.parse(f.read())


def _module_all(tree: ast.Module) -> list:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:        # built at run time (a few private modules): no names
                return []
    return []


def _assigned_list(tree: ast.Module, name: str) -> list:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise KeyError(name)


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _module_file(root: str, mod: str) -> str | None:
    rel = mod.replace(".", "/")
    for cand in (rel + ".py", rel + "/__init__.py"):
        if os.path.exists(os.path.join(root, cand)):
            return cand
    return None


def _transfer_entries(root: str) -> list:
    """(target, kind) for everything torch_npu's transfer_to_npu patches."""
    rel = "torch_npu/contrib/transfer_to_npu.py"
    tree = _read(root, rel)
    lists = {n.targets[0].id: list(ast.literal_eval(n.value)) for n in tree.body
             if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
             and isinstance(n.value, ast.List)}
    out: list = []
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def module_all(ref: str) -> list | None:     # torch_npu.npu.amp -> its __all__
        f = _module_file(root, ref)
        return _module_all(_read(root, f)) if f else None

    for fname in ("_patch_cuda", "_patch_profiler"):
        for node in ast.walk(funcs[fname]):
            if isinstance(node, ast.List) and len(node.elts) == 2 and \
                    isinstance(node.elts[0], ast.Constant):
                dest, src = node.elts[0].value, _dotted(node.elts[1])
                names = module_all(src) if src else None
                if names:
                    out += [(f"torch.{dest}.{n}", "replace") for n in names]
                else:
                    out.append((f"torch.{dest}", "replace"))
    init = funcs["_init"]
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_device_wrapper":
            owner = _dotted(node.args[0])
            arg = node.args[1]
            names = lists[arg.id] if isinstance(arg, ast.Name) else ast.literal_eval(arg)
            owner = {"torch.npu.memory": "torch.cuda.memory"}.get(owner, owner)
            out += [(f"{owner}.{n}", "device args") for n in names]
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                target = _dotted(t)
                if not target or not target.startswith("torch.") or \
                        target.startswith("torch._") and "_utils" not in target:
                    continue
                src = ast.unparse(node.value)
                kind = "device args" if "_wrapper_cuda" in src else "replace"
                out.append((target, kind))
    seen, uniq = set(), []
    for e in out:
        if e not in seen:
            seen.add(e)
            uniq.append(e)
    return uniq


def wheel_groups(path: str) -> dict:
    """The public names of each group, from a torch_npu wheel (or its unzipped directory)."""
    root = _source_root(path)
    npu_init = _read(root, "torch_npu/npu/__init__.py")
    groups: dict = {g: [] for g in GROUPS}
    g = groups["torch.npu"]
    g += [f"torch.npu.{n}" for n in _module_all(npu_init)]
    for sub in ("amp", "random", "utils", "aclnn", "mstx"):
        tree = _read(root, _module_file(root, f"torch_npu.npu.{sub}"))
        names = _module_all(tree)
        if sub == "mstx":       # the class's static methods, as scripts call them
            cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "mstx")
            names = [f.name for f in cls.body if isinstance(f, ast.FunctionDef)] + ["annotate"]
        g += [f"torch.npu.{sub}.{n}" for n in names]
    g += ["torch.npu.aclnn.flags", "torch.npu.aclnn.set_flags"]
    groups["transfer_to_npu"] = [f"{t} [{k}]" for t, k in _transfer_entries(root)]
    exposed = _assigned_list(_read(root, "torch_npu/utils/exposed_api.py"),
                             "public_npu_functions")
    groups["npu_* operators"] = [f"torch_npu.{n}" for n in sorted(exposed)]
    prof = _module_all(_read(root, "torch_npu/profiler/__init__.py"))
    groups["torch_npu.profiler"] = [f"torch_npu.profiler.{n}" for n in prof]
    dist = _module_all(_read(root, "torch_npu/distributed/__init__.py"))
    meta = _read(root, "torch_npu/op_plugin/meta/_meta_registrations.py")
    dtypes = sorted(set(re.findall(r"torch_npu\.(\w+)", ast.unparse(
        next(n for n in meta.body if isinstance(n, ast.Assign) and
             getattr(n.targets[0], "id", "") == "TORCH_NPU_DTYPE_TO_STRING_MAP").value))))
    groups["torch_npu.distributed"] = (
        [f"torch_npu.distributed.{n}" for n in dist] + [f"torch_npu.{d}" for d in dtypes] +
        ["torch_npu.float8_e5m2", "torch_npu.float8_e4m3fn",
         "torch_npu._C._distributed_c10d.ProcessGroupHCCL",
         "torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options"])
    version = ast.literal_eval(next(n for n in _read(root, "torch_npu/version.py").body
                                    if isinstance(n, ast.Assign) and
                                    n.targets[0].id == "__version__").value)
    return {"torch_npu_version": version, "source": os.path.basename(path.rstrip("/")),
            "groups": groups}, _index(root, exposed, dtypes)


def _index(root: str, ops: list, dtypes: list) -> set:
    """Every name the wheel defines, for resolving what code references: each module, its
    top-level names (star-imports followed through ``__all__``), the exported operators and
    dtypes, and the C-extension names its own Python reaches (``torch_npu._C.x.y``)."""
    defs: dict = {}
    stars: dict = {}
    c_names: set = set()
    ops_seen: set = set()
    for dirpath, _, files in os.walk(os.path.join(root, "torch_npu")):
        for fn in files:
            if not fn.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, fn), root)
            mod = rel[:-3].replace(os.sep, ".")
            mod = mod[:-len(".__init__")] if mod.endswith(".__init__") else mod
            try:
                tree = _read(root, rel)
            except SyntaxError:
                continue
            names = set(_module_all(tree))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Assign):
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    for a in node.names:
                        if a.name == "*" and isinstance(node, ast.ImportFrom):
                            base = mod if rel.endswith("__init__.py") else mod.rsplit(".", 1)[0]
                            for _ in range(max(node.level - 1, 0)):
                                base = base.rsplit(".", 1)[0]
                            target = (base + "." + node.module if node.level and node.module
                                      else base if node.level else node.module)
                            stars.setdefault(mod, []).append(target)
                        else:
                            names.add((a.asname or a.name).split(".")[0])
            defs[mod] = names
            text = ast.unparse(tree)
            for m in re.finditer(r"torch_npu\._C(\.\w+)+", text):
                c_names.add(m.group(0))
            # operators torch_npu exports from torch.ops.npu (registered in C++): every one its
            # own Python names, registers a meta kernel for or documents
            ops_seen.update(re.findall(r"torch\.ops\.npu\.(\w+)", text))
            ops_seen.update(re.findall(r"torch_npu\.(npu_\w+|_npu_\w+)", text))
            ops_seen.update(re.findall(r"@impl\(\s*m\s*,\s*['\"](\w+)", text))
            ops_seen.update(re.findall(r"_add_torch_npu_docstr\(\s*['\"](\w+)['\"]", text))
    for _ in range(3):
        for mod, targets in stars.items():
            for t in targets:
                f = _module_file(root, t) if t else None
                if f:
                    defs[mod] |= set(_module_all(_read(root, f))) or defs.get(t, set())
    out = set()
    for mod, names in defs.items():
        out.add(mod)
        out |= {f"{mod}.{n}" for n in names}
    out |= {f"torch_npu.{n}" for n in ops} | {f"torch_npu.{d}" for d in dtypes}
    out |= {f"torch_npu.{n}" for n in ops_seen if n not in ("default", "_dir", "name")}
    out |= {"torch_npu.float8_e5m2", "torch_npu.float8_e4m3fn", "torch_npu.ParallelStore"}
    for c in c_names:
        parts = c.split(".")
        out |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    return {("torch.npu" + n[len("torch_npu.npu"):]) if n.startswith("torch_npu.npu.") or
            n == "torch_npu.npu" else n for n in out}


# ============================================================== what the code bases use
_REF = re.compile(r"\b(torch_npu|torch\.npu)((?:\.[A-Za-z_]\w*)+)")
_FROM = re.compile(r"^\s*from\s+(torch_npu(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]+)", re.M)


def _references(text: str) -> set:
    refs = set()
    for m in _REF.finditer(text):
        refs.add(m.group(1) + m.group(2))
    for m in _FROM.finditer(text):
        names = m.group(2).strip("() \n")
        for n in re.split(r"[,\s]+", names):
            n = n.strip().split(" as ")[0]
            if re.fullmatch(r"[A-Za-z_]\w*", n or ""):
                refs.add(f"{m.group(1)}.{n}")
    return {("torch.npu" + r[len("torch_npu.npu"):]) if r.startswith("torch_npu.npu.") else r
            for r in refs}


def _python_texts(path: str):
    """(relative path, text) of every .py file: a git directory at HEAD, or a folder."""
    if os.path.isdir(os.path.join(path, "objects")) or path.endswith(".git"):
        files = subprocess.run(["git", "--git-dir", path, "grep", "-l", "-E",
                                r"torch_npu|torch\.npu", "HEAD", "--", "*.py"],
                               capture_output=True, text=True, timeout=600).stdout.split()
        for spec in files:
            text = subprocess.run(["git", "--git-dir", path, "show", spec], capture_output=True,
                                  text=True, timeout=60, errors="replace").stdout
            yield spec.split(":", 1)[1], text
        return
    for dirpath, _, names in os.walk(path):
        for fn in names:
            if fn.endswith(".py"):
                p = os.path.join(dirpath, fn)
                with open(p, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                if "torch_npu" in text or "torch.npu" in text:
                    yield os.path.relpath(p, path), text


def _resolve(ref: str, index: set) -> str | None:
    """The longest prefix of ``ref`` the wheel defines (beyond the package itself), or None."""
    parts = ref.split(".")
    start = 2 if parts[0] == "torch" else 1
    for i in range(len(parts), start, -1):
        cand = ".".join(parts[:i])
        if cand in index and cand not in ("torch.npu", "torch_npu"):
            return cand
    return None


def _source_version(path: str) -> str:
    if os.path.isdir(os.path.join(path, "objects")):
        r = subprocess.run(["git", "--git-dir", path, "log", "-1", "--format=%H %cs"],
                           capture_output=True, text=True, timeout=60)
        return "git " + r.stdout.strip()
    init = os.path.join(path, "__init__.py")
    if os.path.exists(init):
        with open(init, encoding="utf-8") as f:
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read())
        if m:
            return f"installed package {os.path.basename(path.rstrip('/'))} {m.group(1)}"
    return "folder " + os.path.basename(path.rstrip("/"))


def usage(specs: list, wheel: dict, index: set) -> dict:
    """``specs``: NAME=PATH (a git directory, read at HEAD, or a source folder); ``index``:
    every name the wheel defines (``wheel_groups``' second result)."""
    names: dict = {}
    missing: dict = {}
    sources = {}
    for spec in specs:
        base, _, path = spec.partition("=")
        if not path:
            raise ValueError(f"usage: expected NAME=PATH, got {spec!r}")
        sources[base] = _source_version(path)
        for rel, text in _python_texts(path):
            for ref in _references(text):
                last = ref.rsplit(".", 1)[-1]
                if last.startswith("__") and last.endswith("__"):
                    continue
                name = _resolve(ref, index)
                if name is None:
                    missing.setdefault(ref, set()).add(base)
                else:
                    names.setdefault(name, {}).setdefault(base, rel)
    return {"method": "python -m benchmarks.npu_coverage usage WHEEL " + " ".join(
                f"{s.split('=')[0]}=<{s.split('=')[0]}>" for s in specs),
            "note": "a git directory is read at its HEAD (here: snapshots of the public "
                    "repositories, github.com/<owner>/<name>: huggingface/accelerate, "
                    "deepspeedai/DeepSpeed, huggingface/trl, huggingface/peft, "
                    "hiyouga/LLaMA-Factory, torchtitan-npu/torchtitan-npu, Ascend/MindSpeed, "
                    "Ascend/MindSpeed-LLM, Ascend/ModelZoo-PyTorch); a folder is an installed "
                    "package (transformers, whose repository snapshot is over 500 MB). Each "
                    "reference resolves to the longest prefix the wheel defines; references "
                    "the wheel does not define (older or newer APIs) are in not_in_wheel.",
            "torch_npu_version": wheel["torch_npu_version"], "sources": sources,
            "names": {n: dict(sorted(b.items())) for n, b in sorted(names.items())},
            "not_in_wheel": {n: sorted(b) for n, b in sorted(missing.items())}}


# ============================================================== npusim's side
_PROBE = r"""
import json, sys, torch, torch_npu
def get(path):
    obj = {"torch": torch, "torch_npu": torch_npu}[path.split(".")[0]]
    for p in path.split(".")[1:]:
        obj = getattr(obj, p)
    return obj
entries = json.loads(sys.stdin.read())
before = {}
for t in entries:
    try:
        before[t] = id(get(t))
    except Exception:
        before[t] = None
from torch_npu.contrib import transfer_to_npu  # noqa
out = {}
for t in entries:
    try:
        obj = get(t)
    except Exception:
        out[t] = False
        continue
    out[t] = bool(getattr(obj, "_npusim_cuda_wrapped", False)) or id(obj) != before[t]
print(json.dumps(out))
"""


def _status_of(obj) -> str:
    if getattr(obj, "_npusim_not_supported", False):
        return "raises"
    return "yes"


def npusim_status(groups: dict) -> dict:
    """name -> "yes" / "raises" / "no" for every grouped name (imports torch_npu)."""
    import torch  # noqa: F401
    import torch_npu
    from torch_npu import fused
    out = {}

    def lookup(path: str):
        obj = {"torch": torch, "torch_npu": torch_npu}[path.split(".")[0]]
        for p in path.split(".")[1:]:
            obj = getattr(obj, p)
        return obj

    for g, names in groups.items():
        if g == "transfer_to_npu":
            continue
        for n in names:
            leaf = n.rsplit(".", 1)[-1]
            if g == "npu_* operators" and leaf in getattr(fused, "UNSUPPORTED", ()):
                out[n] = "raises" if hasattr(torch_npu, leaf) else "no"
                continue
            try:
                out[n] = _status_of(lookup(n))
            except AttributeError:
                out[n] = "no"
    targets = [e.rsplit(" [", 1)[0] for e in groups["transfer_to_npu"]]
    r = subprocess.run([sys.executable, "-c", _PROBE], input=json.dumps(targets),
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep +
                                os.environ.get("PYTHONPATH", "")))
    if r.returncode != 0:
        raise RuntimeError(f"the transfer_to_npu probe failed: {r.stderr[-2000:]}")
    patched = json.loads(r.stdout.strip().splitlines()[-1])
    for e in groups["transfer_to_npu"]:
        out[e] = "yes" if patched.get(e.rsplit(" [", 1)[0]) else "no"
    return out


def _test_texts() -> list:
    out = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "tests")):
        for fn in files:
            if fn.endswith(".py"):
                with open(os.path.join(dirpath, fn), encoding="utf-8") as f:
                    out.append(f.read())
    return out


def tested(name: str, texts: list) -> bool:
    """A grep: a test names the last two parts of ``name`` (``npu.get_rng_state_all``,
    ``profiler.schedule``, ``cuda.set_device``; a top-level torch_npu name as
    ``torch_npu.<name>`` or imported from torch_npu)."""
    target = name.rsplit(" [", 1)[0]
    parts = target.split(".")
    leaf = parts[-1]
    if target.startswith("torch_npu.") and len(parts) == 2:
        pats = [rf"torch_npu\.{re.escape(leaf)}\b", rf"from torch_npu import [^\n]*\b{leaf}\b"]
    else:
        pats = [rf"\b{re.escape(parts[-2])}\.{re.escape(leaf)}\b"]
        if parts[-2] == "__init__":
            pats = [rf"\b{re.escape(parts[-3])}\("]
    rx = re.compile("|".join(pats))
    if any(rx.search(t) for t in texts):
        return True
    # a torch_npu submodule imported under a name of its own (``from torch_npu import profiler
    # as tp``; ``from torch_npu.distributed import is_hccl_available``): its names used as such
    if target.startswith("torch_npu.") and len(parts) == 3:
        mod = parts[1]
        imported = re.compile(rf"from torch_npu import {mod} as (\w+)")
        direct = re.compile(rf"from torch_npu\.{mod} import [^\n]*\b{re.escape(leaf)}\b")
        for t in texts:
            if direct.search(t):
                return True
            for alias in imported.findall(t):
                if re.search(rf"\b{alias}\.{re.escape(leaf)}\b", t):
                    return True
    return False


# ============================================================== the page
def build(wheel: dict, use: dict, status: dict, texts: list) -> tuple[str, dict]:
    groups = wheel["groups"]
    rows, counts = {}, {}
    for g in GROUPS:
        rs = []
        for n in groups[g]:
            rs.append({"name": n, "npusim": status.get(n, "no"), "tested": tested(n, texts)})
        rows[g] = rs
        counts[g] = {"names": len(rs), "yes": sum(r["npusim"] == "yes" for r in rs),
                     "raises": sum(r["npusim"] == "raises" for r in rs),
                     "tested": sum(r["tested"] for r in rs)}
    used = use["names"]
    ustat = {}
    for n in used:
        s = status.get(n)
        if s is None:
            s = _used_status(n)
        ustat[n] = s
    bases = sorted(use["sources"])
    weight = {n: len(b) for n, b in used.items()}
    n_used = len(used)
    have = sum(ustat[n] in ("yes", "raises") for n in used)
    works = sum(ustat[n] == "yes" for n in used)
    wsum = sum(weight.values()) or 1
    summary = {"used": n_used, "present": have, "works": works,
               "present_share": round(have / max(n_used, 1), 4),
               "works_share": round(works / max(n_used, 1), 4),
               "present_weighted": round(sum(weight[n] for n in used
                                             if ustat[n] in ("yes", "raises")) / wsum, 4)}
    doc = {"torch_npu_version": wheel["torch_npu_version"], "wheel": wheel["source"],
           "counts": counts, "used": summary, "sources": use["sources"],
           "groups": rows, "used_names": {n: {"bases": sorted(b), "npusim": ustat[n]}
                                          for n, b in used.items()}}
    return _render(doc, bases), doc


_USED_STATUS: dict = {}


def _used_status(name: str) -> str:
    return _USED_STATUS.get(name, "no")


_PATCHES_ON_IMPORT = "torch_npu.contrib.transfer_to_npu"


def used_status(names) -> None:
    """Status of the used names not in a group (imports torch_npu)."""
    import torch
    import torch_npu
    for n in names:
        obj = {"torch": torch, "torch_npu": torch_npu}[n.split(".")[0]]
        try:
            for p in n.split(".")[1:]:
                obj = getattr(obj, p)
            _USED_STATUS[n] = _status_of(obj)
        except (AttributeError, ImportError):
            mod = n.replace("torch.npu", "torch_npu.npu", 1)
            if mod.startswith(_PATCHES_ON_IMPORT):
                # found, never run: importing it patches torch.cuda for the whole process (the
                # suite's later tests saw torch.cuda.is_available() True)
                import importlib.util
                _USED_STATUS[n] = "yes" if importlib.util.find_spec(mod) else "no"
                continue
            try:          # a module of torch_npu that is not imported by default
                import importlib
                importlib.import_module(mod)
                _USED_STATUS[n] = "yes"
            except ImportError:
                _USED_STATUS[n] = "no"


def _render(doc: dict, bases: list) -> str:
    u = doc["used"]
    L = ["# Coverage of torch_npu's names", "",
         "<!-- generated by `python -m benchmarks.npu_coverage page --write` from "
         "benchmarks/npu_coverage_wheel.json, benchmarks/npu_coverage_usage.json and npusim's "
         "own names; tests/torch/test_npu_coverage.py checks it is current -->", "",
         f"Against torch_npu {doc['torch_npu_version']} ({doc['wheel']}, its Python sources "
         "read with `ast`). *npusim*: `yes` the name works as torch_npu's; `raises` it exists "
         "and raises an error saying why it has no meaning on a simulated NPU (a CANN kernel, "
         "graph capture, hardware fault recovery); `no` missing. *tested*: a test under tests/ "
         "names it (a grep of its last two parts, not a trace). The methods: "
         "benchmarks/npu_coverage.py.", "",
         "## The names real code uses", "",
         f"{u['used']} names of torch_npu {doc['torch_npu_version']} are referenced by the "
         f"{len(bases)} code bases below (`torch_npu.x`, `torch.npu.x`, `from torch_npu... "
         f"import x`, resolved to the name the wheel defines). npusim has **{u['present']} of "
         f"them ({100 * u['present_share']:.0f} %)**, {u['works']} working "
         f"({100 * u['works_share']:.0f} %) and the rest raising; weighted by how many code "
         f"bases use each, {100 * u['present_weighted']:.0f} %.", "",
         "| code base | read at |", "|---|---|"]
    L += [f"| {b} | {doc['sources'][b]} |" for b in bases]
    L += ["", "## Per group", "",
          "`torch.npu`: `torch_npu.npu.__all__` and the `__all__` of its amp, random, utils, "
          "aclnn and mstx parts (mstx's methods), aclnn's flags. `transfer_to_npu`: every "
          "attribute its `_init` sets (`[replace]`) and every function whose device arguments "
          "it rewrites (`[device args]`), torch's compiler internals (`torch._dynamo`, "
          "`torch._inductor`) left out; its `no` rows are what npusim's transfer_to_npu leaves "
          "out on purpose (its module docstring says why). `npu_* operators`: torch_npu's "
          "public operator list (`exposed_api.public_npu_functions`; torch_npu/fused). "
          "`torch_npu.profiler`: its `__all__`. `torch_npu.distributed`: its `__all__`, the "
          "named dtypes, ProcessGroupHCCL and its Options.", "",
          "| group | names | yes | raises | no | tested |", "|---|---|---|---|---|---|"]
    for g in GROUPS:
        c = doc["counts"][g]
        L.append(f"| {g} | {c['names']} | {c['yes']} | {c['raises']} | "
                 f"{c['names'] - c['yes'] - c['raises']} | {c['tested']} |")
    L += ["", "## Used names", "", "| name | code bases | npusim |", "|---|---|---|"]
    for n, v in sorted(doc["used_names"].items(), key=lambda kv: (-len(kv[1]["bases"]), kv[0])):
        L.append(f"| `{n}` | {', '.join(v['bases'])} | {v['npusim']} |")
    for g in GROUPS:
        L += ["", f"## {g}", "", "| name | npusim | tested |", "|---|---|---|"]
        for r in doc["groups"][g]:
            L.append(f"| `{r['name']}` | {r['npusim']} | {'yes' if r['tested'] else ''} |")
    return "\n".join(L) + "\n"


def page() -> tuple[str, dict]:
    with open(WHEEL_JSON, encoding="utf-8") as f:
        wheel = json.load(f)
    with open(USAGE_JSON, encoding="utf-8") as f:
        use = json.load(f)
    status = npusim_status(wheel["groups"])
    used_status([n for n in use["names"] if n not in status])
    return build(wheel, use, status, _test_texts())


def _dump(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "wheel":
        if len(rest) != 1:
            print("usage: python -m benchmarks.npu_coverage wheel WHEEL_OR_DIR", file=sys.stderr)
            return 2
        _dump(WHEEL_JSON, wheel_groups(rest[0])[0])
        print(f"wrote {WHEEL_JSON}")
    elif cmd == "usage":
        if len(rest) < 2:
            print("usage: python -m benchmarks.npu_coverage usage WHEEL_OR_DIR NAME=PATH ...",
                  file=sys.stderr)
            return 2
        wheel, index = wheel_groups(rest[0])
        _dump(USAGE_JSON, usage(rest[1:], wheel, index))
        print(f"wrote {USAGE_JSON}")
    elif cmd == "page":
        text, doc = page()
        if "--write" in rest:
            with open(PAGE, "w", encoding="utf-8") as f:
                f.write(text)
            _dump(PAGE_JSON, doc)
            print(f"wrote {PAGE} and {PAGE_JSON}")
        else:
            sys.stdout.write(text)
    else:
        print(f"unknown subcommand {cmd!r}: wheel, usage or page", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
