"""Calendar: resolve contact ids, create events with YYYY-MM-DD dates and 24h times, send invites."""

from __future__ import annotations

import random
import re
from datetime import datetime

from .base import (FIRST_NAMES, LAST_NAMES, MONTHS, Backend, Done, Family, Step, Tool, ToolError,
                   call, new_id, results)

YEAR = 2025
TITLES = ["Budget review", "Team sync", "Lunch", "Design chat", "Planning", "Retro",
          "Demo prep", "Coffee", "Hiring debrief", "Roadmap", "Standup", "Offsite prep"]
DATE_RE, TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}"), re.compile(r"\d{2}:\d{2}")


def _valid(value: str, pattern: re.Pattern, fmt: str) -> bool:
    """Whether ``value`` has exactly the zero-padded shape and is a real date/time."""
    try:
        datetime.strptime(value, fmt)
    except ValueError:
        return False
    return pattern.fullmatch(value) is not None


def spoken_time(hhmm: str) -> str:
    """``15:00`` -> ``3pm``."""
    hour = int(hhmm[:2])
    return f"{(hour - 1) % 12 + 1}{'am' if hour < 12 else 'pm'}"


def spoken_date(iso: str) -> str:
    """``2025-03-05`` -> ``March 5``."""
    return f"{MONTHS[int(iso[5:7]) - 1]} {int(iso[8:])}"


class CalendarBackend(Backend):
    """Contacts ``{id: name}`` and events ``{id: {title, date, time, attendees, invited}}``."""

    def __init__(self, contacts: dict[str, str], rng: random.Random) -> None:
        super().__init__()
        self.contacts = contacts
        self.events: dict[str, dict] = {}
        self._rng = rng
        self._ids = set(contacts)

    def tool_search_contacts(self, name: str) -> dict:
        query = name.strip().lower()
        found = [{"name": n, "id": i} for i, n in self.contacts.items() if query and query in n.lower()]
        if not found:
            raise ToolError(f"no contacts match {name}")
        return {"contacts": found[:4]}

    def tool_create_event(self, title: str, date: str, time: str, attendee_ids: list[str]) -> dict:
        if not _valid(date, DATE_RE, "%Y-%m-%d"):
            raise ToolError("date must be YYYY-MM-DD")
        if not _valid(time, TIME_RE, "%H:%M"):
            raise ToolError("time must be HH:MM (24h)")
        unknown = [i for i in attendee_ids if i not in self.contacts]
        if unknown:
            raise ToolError(f"unknown contact id {unknown[0]}")
        eid = new_id(self._rng, "ev", self._ids)
        self.events[eid] = {"title": title, "date": date, "time": time,
                            "attendees": list(attendee_ids), "invited": False}
        return {"event_id": eid}

    def tool_send_invites(self, event_id: str) -> dict:
        event = self.events.get(event_id)
        if event is None:
            raise ToolError(f"unknown event id {event_id}")
        if event["invited"]:
            raise ToolError(f"invites for {event_id} already sent")
        event["invited"] = True
        return {"event_id": event_id, "sent": len(event["attendees"])}


class Calendar(Family):
    name = "calendar"
    prefix = "cal"
    tools = (
        Tool("search_contacts", {"name": "str"}, "find contact ids by name"),
        Tool("create_event", {"title": "str", "date": "str", "time": "str", "attendee_ids": "ids"}, "create an event"),
        Tool("send_invites", {"event_id": "str"}, "invite the event's attendees"),
    )
    rules = f"Dates are YYYY-MM-DD (year {YEAR}), times 24h HH:MM. Send invites after creating an event."

    def sample_goal(self, rng: random.Random) -> tuple[str, dict]:
        people = [f"{f} {l}" for f, l in zip(rng.sample(FIRST_NAMES, 3), rng.sample(LAST_NAMES, 3))]
        attendees = people[: rng.choice([1, 1, 2, 2, 3])]
        month, day = rng.randint(1, 12), rng.randint(1, 28)
        goal = {"title": rng.choice(TITLES), "date": f"{YEAR}-{month:02d}-{day:02d}",
                "time": f"{rng.randint(8, 18):02d}:00", "attendees": attendees}
        names = attendees[0] if len(attendees) == 1 else ", ".join(attendees[:-1]) + " and " + attendees[-1]
        text = f"Schedule '{goal['title']}' with {names} on {spoken_date(goal['date'])} at {spoken_time(goal['time'])}."
        return text, goal

    def make_backend(self, goal: dict, rng: random.Random) -> CalendarBackend:
        names = list(goal["attendees"])
        for person in goal["attendees"]:  # namesakes make the search results ambiguous by first name
            if rng.random() < 0.6:
                names.append(f"{person.split()[0]} {rng.choice([l for l in LAST_NAMES if l not in person])}")
        names += [f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}" for _ in range(3)]
        unique = list(dict.fromkeys(names))
        rng.shuffle(unique)
        taken: set[str] = set()
        return CalendarBackend({new_id(rng, "ct", taken): n for n in unique}, rng)

    def checks(self, backend: CalendarBackend, goal: dict) -> dict[str, bool]:
        last = list(backend.events.values())[-1] if backend.events else {}
        attendees = [backend.contacts[i] for i in last.get("attendees", [])]
        return {
            "one_event": len(backend.events) == 1 and last["title"] == goal["title"],
            "date_time": (last.get("date"), last.get("time")) == (goal["date"], goal["time"]),
            "attendees": sorted(attendees) == sorted(goal["attendees"]),
            "invited": bool(last.get("invited")),
        }

    @staticmethod
    def _known(done: Done, person: str) -> str | None:
        for _, res in results(done, "search_contacts"):
            for contact in res["contacts"]:
                if contact["name"] == person:
                    return contact["id"]
        return None

    def _event_args(self, goal: dict, ids: list[str]) -> dict:
        return {"title": goal["title"], "date": goal["date"], "time": goal["time"], "attendee_ids": ids}

    def next_step(self, goal: dict, done: Done) -> Step:
        ids = []
        for person in goal["attendees"]:
            ident = self._known(done, person)
            if ident is None:
                return "search_contacts", {"name": person}
            ids.append(ident)
        made = [r["event_id"] for _, r in results(done, "create_event")]
        if not made:  # an event that was created is taken as the one intended
            return "create_event", self._event_args(goal, ids)
        if not any(a["event_id"] == made[-1] for a, _ in results(done, "send_invites")):
            return "send_invites", {"event_id": made[-1]}
        return "Done."

    def mistakes(self, goal: dict, done: Done, step: Step, rng: random.Random) -> list[str]:
        if isinstance(step, str):
            return []
        name, args = step
        if name == "search_contacts":  # a name in the wrong order, or creating the event too early
            first, last = args["name"].split()
            found = [i for i in (self._known(done, p) for p in goal["attendees"]) if i]
            return [call(name, name=f"{last}, {first}"), call("create_event", **self._event_args(goal, found))]
        if name == "send_invites":  # creates the event a second time instead
            return [call("create_event", **next(a for a, _ in reversed(results(done, "create_event"))))]
        if name != "create_event":
            return []
        date, time = args["date"], args["time"]
        bad = [
            {"date": spoken_date(date)},
            {"date": f"{date[5:7]}/{date[8:]}/{YEAR}"},
            {"time": spoken_time(time)},
            {"date": f"{YEAR - 1}{date[4:]}"},
            {"date": f"{YEAR}-{date[8:]}-{date[5:7]}"},
        ]
        if len(args["attendee_ids"]) > 1:
            bad.append({"attendee_ids": args["attendee_ids"][:-1]})
        return [call(name, **{**args, **b}) for b in bad]
