"""Test helpers shared by every test package: loopback ports, processes started and
stopped by PID, real etcd servers, waiting for conditions, and the actor simulation
(``helpers.actorsim``: a bookie's real cores driven message by message).

``tests/`` is on sys.path while pytest runs (tests/conftest.py is a rootdir conftest), so
these import as ``helpers.procs``, ``helpers.etcd``, ``helpers.wait``."""
