"""The chaos run: real processes, seeded faults, end-to-end guarantees checked.
See docs/chaos.md; the harness is tests/chaos/harness.py (bench/chaos.py imports it too)."""
