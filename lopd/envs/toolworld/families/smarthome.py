"""Smart-home apps: find a room's thermostat, set it. Hidden per app: the unit (°C or °F), an
unlock before any change, and changes that wait for apply."""

from __future__ import annotations

import random

from .base import Family, Tool

ROOMS = ("bedroom", "kitchen", "office", "lounge", "hallway", "garage", "bathroom", "nursery",
         "attic", "basement", "studio", "den", "porch", "laundry", "pantry", "library")
MODES = ("heat", "cool", "eco")


class SmartHome(Family):
    name = "smarthome"
    prefix = "home"
    apps = ("Homely", "Nestor", "Lumen", "Hearth", "Cozy", "Breeze", "Atrium", "Ember")
    formats = ("C", "F")
    literal_format = "C"
    tools = (
        Tool("find_thermostat", {"room": "str"}, "lookup"),
        Tool("unlock", {"device_id": "str"}, "prereq"),
        Tool("set_thermostat", {"device_id": "str", "mode": "str", "temp": "int", "unit": "str"}, "main"),
        Tool("apply", {"change_id": "str"}, "commit"),
    )
    entity_noun, entity_prefix, record_prefix = "thermostat", "dev", "chg"
    prereq_word, prereq_error = "unlocked", "the thermostat is locked: unlock it first"
    words = ROOMS + MODES

    def sample_goal(self, rng: random.Random, app: str) -> tuple[str, dict]:
        room, mode, temp = rng.choice(ROOMS), rng.choice(MODES), rng.randint(17, 26)
        return (f"At {app}, set the {room} thermostat to {mode} at {temp} degrees.",
                {"app": app, "room": room, "mode": mode, "temp": temp})

    def entity_key(self, goal: dict) -> str:
        return goal["room"]

    def lookup_args(self, goal: dict) -> dict:
        return {"room": goal["room"]}

    def main_args(self, goal: dict, fmt: str, ident: str, found: dict) -> dict:
        return {"device_id": ident, "mode": goal["mode"], "temp": goal["temp"], "unit": fmt}

    def distractors(self, goal: dict, rng: random.Random) -> list[str]:
        return rng.sample([r for r in ROOMS if r != goal["room"]], 2)
