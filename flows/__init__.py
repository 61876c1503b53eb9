"""Prefect orchestration of the ``lopd`` stages (no logic lives here)."""
