"""Banking apps: find a payee, pay them. Hidden per app: amounts in cents or dollars, a payee
verification before paying, and a confirmation that releases the payment."""

from __future__ import annotations

import random

from .base import FIRST_NAMES, Family, Tool


class Banking(Family):
    name = "banking"
    prefix = "bank"
    apps = ("Northwind", "Bluefin", "Oakridge", "Summit", "Harbor", "Crescent", "Ironbark", "Meridian")
    formats = ("cents", "dollars")
    literal_format = "dollars"
    tools = (
        Tool("find_payee", {"name": "str"}, "lookup"),
        Tool("verify_payee", {"payee_id": "str"}, "prereq"),
        Tool("pay", {"payee_id": "str", "amount": "int"}, "main"),
        Tool("confirm", {"payment_id": "str"}, "commit"),
    )
    entity_noun, entity_prefix, record_prefix = "payee", "py", "pm"
    prereq_word, prereq_error = "verified", "verify the payee first"
    words = FIRST_NAMES

    def sample_goal(self, rng: random.Random, app: str) -> tuple[str, dict]:
        name, dollars = rng.choice(FIRST_NAMES), rng.randint(2, 99)
        return f"At {app}, pay {name} ${dollars}.", {"app": app, "name": name, "dollars": dollars}

    def entity_key(self, goal: dict) -> str:
        return goal["name"]

    def lookup_args(self, goal: dict) -> dict:
        return {"name": goal["name"]}

    def main_args(self, goal: dict, fmt: str, ident: str, found: dict) -> dict:
        return {"payee_id": ident, "amount": goal["dollars"] * (100 if fmt == "cents" else 1)}
