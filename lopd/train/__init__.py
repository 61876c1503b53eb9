"""Layer `train`: the learning algorithms — pure losses, the on-policy loop, LOPD and its baselines' trainers.

Imports ``lopd.memory``, ``lopd.latent`` and below. See docs/architecture.md.
"""
