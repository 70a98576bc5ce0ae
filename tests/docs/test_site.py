"""The docs site (mkdocs.yml) builds in strict mode: a broken link or anchor, a missing page
or reference, or any other warning fails the build, and so this test. The built site then
has what it promises: the API reference shows every public name of ``zbk`` and
``zbk.errors`` with its docstring, the configuration reference every key, and the
diagrams rendered from their Graphviz sources."""

from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zbk
import zbk.errors
from zbk.config.reference import class_doc, config_classes, keys

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300.0

if importlib.util.find_spec("mkdocs") is None and not os.environ.get("CI"):
    # CI (scripts/test.sh) installs the docs extra, and there a missing MkDocs fails the build.
    pytest.skip("needs the docs extra: pip install -e '.[docs]'", allow_module_level=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert not re.search(r"^(WARNING|ERROR)\b", log, re.M), log
    return out


def _words(text: str) -> list[str]:
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).split()


def _page_words(path: Path) -> str:
    text = html.unescape(re.sub(r"<[^>]+>", " ", path.read_text()))
    return " " + " ".join(_words(text)) + " "


def _first_sentence_words(doc: str) -> str:
    first = inspect.cleandoc(doc).split("\n\n")[0]
    return " " + " ".join(_words(first)[:12]) + " "


def _module_attribute_docs(module: object) -> dict[str, str]:
    """The attribute docstrings of a module's constants (a string literal right after the
    assignment), which is how mkdocstrings documents them."""
    body = ast.parse(inspect.getsource(module)).body  # type: ignore[arg-type]
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if (isinstance(target, ast.Name) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[target.id] = after.value.value
    return docs


def _own_doc(name: str, obj: object) -> str:
    if inspect.isclass(obj):
        return class_doc(obj)  # not the signature @dataclass makes up for a class without one
    if inspect.isfunction(obj):
        return obj.__doc__ or ""
    module, attr = name.rsplit(".", 1)
    return _module_attribute_docs(sys.modules[module]).get(attr, "")


def _public_names() -> list[tuple[str, object]]:
    names = [(f"zbk.{n}", getattr(zbk, n)) for n in zbk.__all__ if n not in ("errors", "__version__")]
    for name, obj in vars(zbk.errors).items():
        if name.startswith("_"):
            continue
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ == "zbk.errors":
            names.append((f"zbk.errors.{name}", obj))
        elif name.isupper():
            names.append((f"zbk.errors.{name}", obj))  # the exit codes
    return names


def _reference_pages(site: Path) -> list[Path]:
    return sorted((site / "reference").rglob("index.html"))


def test_the_site_builds_in_strict_mode(site: Path) -> None:
    for page in ("index.html", "operations/index.html", "contributors/index.html", "reference/index.html",
                 "reference/configuration/index.html"):
        assert (site / page).is_file(), page


@pytest.mark.parametrize("name, obj", _public_names(), ids=[n for n, _ in _public_names()])
def test_every_public_name_is_in_the_api_reference_with_its_docstring(site: Path, name: str, obj: object) -> None:
    # The reference documents a name where it is defined (zbk loads its classes lazily).
    if inspect.isclass(obj) or inspect.isfunction(obj):
        path = f"{obj.__module__}.{obj.__qualname__}"
    else:
        path = name
    pages = [p for p in _reference_pages(site) if f'id="{path}"' in p.read_text()]
    assert pages, f"{name}: no heading id {path} in any reference page"
    doc = _own_doc(name, obj)
    assert doc.strip(), f"{name} has no docstring"
    assert _first_sentence_words(doc) in _page_words(pages[0]), f"{name}: its docstring is not on {pages[0]}"


def test_the_configuration_reference_lists_every_key(site: Path) -> None:
    page = (site / "reference" / "configuration" / "index.html").read_text()
    for cls in config_classes():
        for key in keys(cls):
            assert f"<code>{key.name}</code>" in page, (cls.__name__, key.name)


def test_every_diagram_is_rendered_and_shown(site: Path) -> None:
    sources = sorted((REPO / "docs" / "diagrams").glob("*.dot"))
    assert len(sources) >= 2
    pages = "".join(p.read_text() for p in site.rglob("*.html"))
    for source in sources:
        svg = site / "diagrams" / f"{source.stem}.svg"
        assert "<svg" in svg.read_text(), svg
        assert f"diagrams/{svg.name}" in pages, f"no page shows {svg.name}"
