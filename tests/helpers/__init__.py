"""Test helpers shared by every test package: loopback ports, processes started and
stopped by PID, real etcd servers, waiting for conditions.

``tests/`` is on sys.path while pytest runs (tests/conftest.py is a rootdir conftest), so
these import as ``helpers.procs``, ``helpers.etcd``, ``helpers.wait``."""
