"""MkDocs hooks of the docs site (mkdocs.yml, ``hooks:``): the pages and pictures made at
build time from sources in the repository, so that none of them can go stale.

- ``reference/configuration.md``: the configuration reference, rendered from the config
  dataclasses by ``zbk.config.reference.render()``.
- ``diagrams/NAME.svg``: each Graphviz source ``docs/diagrams/NAME.dot``, rendered by
  ``dot -Tsvg`` (Debian's graphviz package; scripts/setup.sh installs it).

A failure here stops the build: a page that names a missing picture or key is a broken page.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

CONFIG_REFERENCE = "reference/configuration.md"
DIAGRAMS = "diagrams"
DOT_TIMEOUT_S = 60.0
RENDER_TIMEOUT_S = 60.0


def _repo(config: Any) -> Path:
    return Path(config.config_file_path).resolve().parent


def render_config_reference(repo: Path) -> str:
    """The configuration reference of the zbk in ``repo``, rendered by a fresh interpreter:
    under ``mkdocs serve`` an edited config class shows at the next rebuild (modules
    imported into this process would stay as first loaded), and no zbk installed elsewhere
    (an editable install of another checkout, say) can stand in for this one."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-m", "zbk.config.reference"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=RENDER_TIMEOUT_S)
    if res.returncode != 0:
        raise PluginError(f"python -m zbk.config.reference (exit {res.returncode}): {res.stderr.strip()}")
    return res.stdout


def render_dot(source: Path) -> str:
    """``source`` (a Graphviz file) as SVG text."""
    dot = shutil.which("dot")
    if dot is None:
        raise PluginError("Graphviz's dot is not installed (apt-get install graphviz; scripts/setup.sh does)")
    res = subprocess.run([dot, "-Tsvg", str(source)], capture_output=True, text=True, timeout=DOT_TIMEOUT_S)
    if res.returncode != 0 or res.stderr.strip():
        # dot writes warnings (an unknown attribute, a bad label) to stderr and still exits 0:
        # in a strict build they fail it too.
        raise PluginError(f"dot -Tsvg {source} (exit {res.returncode}): {res.stderr.strip()}")
    return res.stdout


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, CONFIG_REFERENCE, content=render_config_reference(_repo(config))))
    docs = Path(config.docs_dir)
    for source in sorted((docs / DIAGRAMS).glob("*.dot")):
        files.append(File.generated(config, f"{DIAGRAMS}/{source.stem}.svg", content=render_dot(source)))
    return files
