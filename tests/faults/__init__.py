"""Fault runs judged by their history: the history format and recorder (history.py), a
recording client (recorded.py) and the checker (checker.py), which knows nothing of how a
run was made."""
