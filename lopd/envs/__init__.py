"""Environments that LOPD agents are trained and evaluated in.

``env.name`` picks one through :mod:`lopd.envs.registry` (ToolWorld by default, the code domain,
BFCL v4 multi-turn, or a user's own ``package.module:factory``); nothing above this layer imports a
concrete environment. :mod:`lopd.envs.protocol` (the tool-call format) and :mod:`lopd.envs.passk`
(the pass@k estimator) are shared.
"""
