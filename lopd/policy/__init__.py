"""Layer `policy`: the model that acts — backbone, chat format, batched multi-turn rollouts, backends, log-prob scoring.

Imports ``lopd.envs``, the core and ``lopd.ops``. See docs/architecture.md.
"""
