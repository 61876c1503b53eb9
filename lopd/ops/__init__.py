"""Layer `ops`: services every working layer may call — MLflow tracking, Prefect events, data-quality gates.

Imports only the core (``lopd.config``, ``lopd.io``, ``lopd.layout``). See docs/architecture.md.
"""
