"""Layer `memory`: the experience bank B and its retrieval (spec steps 1–2) — bank files, observation-lite text,
embeddings, FAISS indexes, top-k retrieval.

Imports ``lopd.policy`` and below; never ``lopd.latent`` (its peer). See docs/architecture.md.
"""
