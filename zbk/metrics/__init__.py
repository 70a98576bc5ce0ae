"""Prometheus metrics and the HTTP admin endpoint every process serves."""
