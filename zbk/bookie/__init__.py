"""The bookie process: boot (boot.py), registration (registration.py), the admin HTTP
routes (admin.py), and the process that wires the actors and stops them (process.py)."""
