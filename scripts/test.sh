#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The whole suite includes the Spark data source tests (the spark extra and Java) and the
# strict build of the docs site (the docs extra and Graphviz; tests/docs/test_site.py).
export ZBK_EXTRAS=${ZBK_EXTRAS:-dev,spark,docs}
bash scripts/setup.sh
# Local Spark binds the driver to loopback, never to a public interface.
export SPARK_LOCAL_IP=127.0.0.1
export PYTHONUNBUFFERED=1
set +e
# --tb=native: pytest's own traceback renderer can hit a CPython 3.11 bug (gh-106905,
# "AST constructor recursion depth mismatch") and hide the real failure.
.venv/bin/python -m pytest -q --timeout=600 --tb=native "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "test: pytest collected no tests — that is a failure" >&2
  exit 1
fi
exit $rc
