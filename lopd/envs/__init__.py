"""Environments that LOPD agents are trained and evaluated in."""
