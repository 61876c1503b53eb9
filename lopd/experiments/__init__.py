"""Layer `experiments`: multi-seed sweeps over the stages, and their reports (efficiency, curves, ablations).

Imports ``lopd.stages`` and below. See docs/architecture.md.
"""
