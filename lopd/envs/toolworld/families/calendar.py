"""Calendar apps: find a contact, book a meeting. Hidden per app: 12h or 24h times, an
availability check before booking, and invites that must be sent."""

from __future__ import annotations

import random

from .base import FIRST_NAMES, Family, Tool

TITLES = ("Lunch", "Standup", "Review", "Retro", "Planning", "Coffee", "Demo", "Interview",
          "Workshop", "Sync", "Onboarding", "Brainstorm")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
HOURS = range(9, 18)


def twelve_hour(hour: int) -> str:
    """``15`` -> ``3pm``."""
    return f"{(hour - 1) % 12 + 1}{'am' if hour < 12 else 'pm'}"


class Calendar(Family):
    name = "calendar"
    prefix = "cal"
    apps = ("Plannr", "Tempo", "Agenda", "Chrono", "Slate", "Orbit", "Quill", "Dayton")
    formats = ("12h", "24h")
    literal_format = "12h"
    tools = (
        Tool("find_contact", {"name": "str"}, "lookup"),
        Tool("check_availability", {"contact_id": "str"}, "prereq"),
        Tool("create_event", {"contact_id": "str", "title": "str", "day": "str", "time": "str"}, "main"),
        Tool("send_invites", {"event_id": "str"}, "commit"),
    )
    entity_noun, entity_prefix, record_prefix = "contact", "ct", "ev"
    prereq_word, prereq_error = "available", "check the contact's availability first"
    words = FIRST_NAMES + TITLES + DAYS

    def sample_goal(self, rng: random.Random, app: str) -> tuple[str, dict]:
        name, title, day, hour = rng.choice(FIRST_NAMES), rng.choice(TITLES), rng.choice(DAYS), rng.choice(HOURS)
        return (f"At {app}, book {title} with {name} on {day} at {twelve_hour(hour)}.",
                {"app": app, "name": name, "title": title, "day": day, "hour": hour})

    def entity_key(self, goal: dict) -> str:
        return goal["name"]

    def lookup_args(self, goal: dict) -> dict:
        return {"name": goal["name"]}

    def main_args(self, goal: dict, fmt: str, ident: str, found: dict) -> dict:
        time = twelve_hour(goal["hour"]) if fmt == "12h" else f"{goal['hour']:02d}:00"
        return {"contact_id": ident, "title": goal["title"], "day": goal["day"], "time": time}

    def distractors(self, goal: dict, rng: random.Random) -> list[str]:
        return rng.sample([n for n in FIRST_NAMES if n != goal["name"]], 2)
