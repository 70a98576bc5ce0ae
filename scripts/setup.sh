#!/usr/bin/env bash
# Sets up everything zbk needs on a fresh Debian machine: system packages, then a virtualenv
# in .venv with the project and its test extras. Idempotent: a second run does little.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  local need=()
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
  # nft and ip for the network-fault tests (tests/faults): nft lives in /usr/sbin
  [ -x /usr/sbin/nft ] || command -v nft >/dev/null 2>&1 || need+=(nftables)
  command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need+=(iproute2)
  # fuse3 (fusermount3, libfuse3) for the power-loss layer of the fault tests (tests/faults).
  command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
  # libfaketime for the clock-fault tests (tests/faults/test_clock_*.py).
  command -v faketime >/dev/null 2>&1 || need+=(faketime)
  # Java for local Spark (the spark extra's tests); only when the spark extra is asked for.
  case ",${ZBK_EXTRAS:-dev}," in
    *,spark,*) command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless) ;;
  esac
  # Graphviz's dot renders the site's diagrams (docs/diagrams/*.dot); only for the docs extra.
  case ",${ZBK_EXTRAS:-dev}," in
    *,docs,*) command -v dot >/dev/null 2>&1 || need+=(graphviz) ;;
  esac
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]} (apt)"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

apt_install
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
extras=${ZBK_EXTRAS:-dev}
if [ -x .venv/bin/pip ]; then
  echo "setup: installing zbk[$extras] into .venv"
  # pip's output is filtered, its exit status is not (pipefail): a failed install stops
  # the setup.
  if ! .venv/bin/pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 \
      | { grep -v -E '^WARNING: (Location|There was)' || true; }; then
    echo "setup: pip install failed" >&2
    exit 1
  fi
else
  # A .venv without pip (made with --without-pip, or the docs test's workspace, whose
  # interpreter is set up already) is used as it is; the import check below judges it.
  echo "setup: .venv has no pip; using it as it is"
fi
.venv/bin/python -c "import zbk, zmq, cbor2, crc32c, prometheus_client" 
