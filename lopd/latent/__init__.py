"""Layer `latent`: the learned privilege (spec steps 3–4) — the latent composer c_φ and the teacher that reads its latents.

Imports ``lopd.policy`` and below; never ``lopd.memory`` (its peer). See docs/architecture.md.
"""
