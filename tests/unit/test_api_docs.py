"""docs/api.md documents every public name of runtime, hccl and launcher (it fails when one is new
and undocumented), and nothing in docs/ or README points outside the repository."""
import enum
import inspect
import os
import re

import pytest

import hccl
import hccl.errors
import launcher
import launcher.errors
import runtime
import runtime.errors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
API = open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8").read()
CLASSES_WITH_METHODS = {"Stream": runtime.Stream, "Event": runtime.Event,
                        "DeviceArray": runtime.DeviceArray, "Comm": hccl.Comm}


def _documented(name: str) -> bool:
    """``name`` appears in code style: `name`, `name(...)`, `name -> ...`; a ``Class.attr`` also
    as `.attr` (a row of the class's attributes)."""
    forms = [name] + ([name[name.index("."):]] if "." in name else [])
    return any(re.search(r"`" + re.escape(f) + r"[`(\s\[]", API) for f in forms)


def _public_names():
    for mod in (runtime, hccl, launcher):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.ismodule(obj):
                continue
            yield f"{mod.__name__}.{name}", name
            if inspect.isclass(obj) and issubclass(obj, enum.Enum):
                for member in obj:
                    yield f"{mod.__name__}.{name}.{member.name}", member.name
    for cname, cls in CLASSES_WITH_METHODS.items():
        for attr, value in vars(cls).items():
            if not attr.startswith("_") and (callable(value) or isinstance(value, property)):
                yield f"{cls.__module__}.{cname}.{attr}", f"{cname}.{attr}"
    for mod in (runtime.errors, hccl.errors, launcher.errors):
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                yield f"{mod.__name__}.{name}", name


@pytest.mark.parametrize("qualified,name", sorted(set(_public_names())))
def test_every_public_name_is_in_the_api_reference(qualified, name):
    assert _documented(name), f"{qualified} is public but docs/api.md does not document `{name}`"


def test_the_check_itself_catches_an_undocumented_name():
    assert _documented("all_reduce") and not _documented("no_such_public_name")


def _doc_files():
    docs = os.path.join(ROOT, "docs")
    yield os.path.join(ROOT, "README.md")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            yield os.path.join(docs, name)


@pytest.mark.parametrize("path", list(_doc_files()), ids=os.path.basename)
def test_docs_link_only_inside_the_repository(path):
    text = open(path, encoding="utf-8").read()
    targets = re.findall(r"\]\(([^)#\s]+)", text) + re.findall(r"`(\.\./[^`\s]+)`", text)
    for target in targets:
        if re.match(r"[a-z]+://", target):
            continue                       # a public web address is fine
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
        assert resolved.startswith(ROOT + os.sep), f"{path}: link {target} leaves the repository"
        assert os.path.exists(resolved), f"{path}: link {target} points to nothing"
    assert "SPEC" not in text and "§" not in text, f"{path} cites a document readers do not have"


def test_no_module_docstring_cites_the_spec():
    for pkg in ("runtime", "hccl", "launcher"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                    assert "SPEC" not in text and "§" not in text, f"{dirpath}/{f} cites SPEC"
