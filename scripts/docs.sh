#!/usr/bin/env bash
# The documentation site (mkdocs.yml): `bash scripts/docs.sh` builds it into ./site in
# strict mode, as CI does (a broken link, a missing reference or any warning fails it);
# `bash scripts/docs.sh serve` builds it and serves it on http://127.0.0.1:8000, rebuilding
# as the pages, the docstrings or the config classes change (Ctrl-C stops it). Extra
# arguments go to mkdocs. Sets up the docs extra (MkDocs, mkdocstrings) and Graphviz first.
set -euo pipefail
cd "$(dirname "$0")/.."
case ",${ZBK_EXTRAS:-}," in
  *,docs,*) ;;
  *) export ZBK_EXTRAS="${ZBK_EXTRAS:+$ZBK_EXTRAS,}docs" ;;
esac
bash scripts/setup.sh >&2
# Material for MkDocs prints a banner about MkDocs 2 on every run; it is not about this site.
export NO_MKDOCS_2_WARNING=1
command=${1:-build}
[ $# -gt 0 ] && shift
case "$command" in
  build) exec .venv/bin/python -m mkdocs build --strict "$@" ;;
  serve) exec .venv/bin/python -m mkdocs serve --strict --dev-addr 127.0.0.1:8000 "$@" ;;
  *) echo "usage: bash scripts/docs.sh [build|serve] [mkdocs options]" >&2; exit 2 ;;
esac
