"""LOPD: Latent On-Policy Self-Distillation — the library behind the pipeline.

Every stage is a plain function here (``lopd.stages.bootstrap.run``, ``lopd.stages.collect.run``, ...)
that the CLI, DVC, the Prefect flows and the tests all call the same way.
"""

__version__ = "0.1.0"
