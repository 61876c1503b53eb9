"""Smart home: list a room's device ids, set the mode before the temperature, always give a unit."""

from __future__ import annotations

import random

from .base import Backend, Done, Family, Step, Tool, ToolError, answer_has, call, new_id, results

ROOMS = ["bedroom", "kitchen", "office", "living room", "hallway", "garage", "bathroom", "nursery",
         "attic", "basement", "studio", "den", "porch", "laundry", "guest room", "dining room"]
MODES = {"thermostat": ("heat", "cool", "eco", "off"), "light": ("on", "off", "dim"), "fan": ("on", "off")}
TEMPS = {"C": (17, 26), "F": (62, 79)}


class HomeBackend(Backend):
    """Devices ``{id: {room, type, mode[, temp, unit]}}``."""

    def __init__(self, devices: dict[str, dict]) -> None:
        super().__init__()
        self.devices = devices

    def _device(self, device_id: str) -> dict:
        if device_id not in self.devices:
            raise ToolError(f"unknown device id {device_id}")
        return self.devices[device_id]

    def tool_list_devices(self, room: str) -> dict:
        found = [{"type": d["type"], "id": i} for i, d in self.devices.items() if d["room"] == room.strip().lower()]
        if not found:
            raise ToolError(f"unknown room {room}")
        return {"devices": found}

    def tool_set_mode(self, device_id: str, mode: str) -> dict:
        device = self._device(device_id)
        allowed = MODES[device["type"]]
        if mode not in allowed:
            raise ToolError(f"{device['type']} mode must be one of {'/'.join(allowed)}")
        device["mode"] = mode
        return {"id": device_id, "mode": mode}

    def tool_set_temperature(self, device_id: str, value: float, unit: str) -> dict:
        device = self._device(device_id)
        if device["type"] != "thermostat":
            raise ToolError(f"{device_id} is not a thermostat")
        if unit not in TEMPS:
            raise ToolError('unit must be "C" or "F"')
        if not 0 <= value <= 100:
            raise ToolError("value out of range")
        device.update(temp=value, unit=unit)
        return {"id": device_id, "temp": value, "unit": unit}

    def tool_get_status(self, device_id: str) -> dict:
        return {"id": device_id, **{k: v for k, v in self._device(device_id).items() if k != "room"}}


class SmartHome(Family):
    name = "smarthome"
    prefix = "home"
    tools = (
        Tool("list_devices", {"room": "str"}, "ids and types of a room's devices"),
        Tool("set_mode", {"device_id": "str", "mode": "str"}, "set a device's mode"),
        Tool("set_temperature", {"device_id": "str", "value": "num", "unit": "str"}, "set a thermostat"),
        Tool("get_status", {"device_id": "str"}, "a device's current state"),
    )
    rules = 'Set the mode before the temperature. Temperatures need unit "C" or "F".'

    def sample_goal(self, rng: random.Random) -> tuple[str, dict]:
        room, r = rng.choice(ROOMS), rng.random()
        if r < 0.5:
            unit = rng.choice("CF")
            goal = {"kind": "climate", "room": room, "device": "thermostat",
                    "mode": rng.choice(MODES["thermostat"][:3]), "value": rng.randint(*TEMPS[unit]), "unit": unit}
            return f"Set the {room} thermostat to {goal['mode']} mode at {goal['value']}°{unit}.", goal
        if r < 0.75:
            device = rng.choice(["light", "light", "fan"])
            mode = rng.choice(MODES[device])
            text = f"Dim the {room} light." if mode == "dim" else f"Turn the {room} {device} {mode}."
            return text, {"kind": "switch", "room": room, "device": device, "mode": mode}
        device = rng.choice(["thermostat", "light", "fan"])
        text = (f"What temperature is the {room} thermostat set to? Give the unit." if device == "thermostat"
                else f"What mode is the {room} {device} in?")
        return text, {"kind": "status", "room": room, "device": device}

    def make_backend(self, goal: dict, rng: random.Random) -> HomeBackend:
        rooms = [goal["room"]] + rng.sample([r for r in ROOMS if r != goal["room"]], 2)
        taken: set[str] = set()
        devices: dict[str, dict] = {}
        for room in rooms:
            kinds = ["thermostat", "light"] + (["fan"] if room == goal["room"] or rng.random() < 0.5 else [])
            rng.shuffle(kinds)
            for kind in kinds:
                modes = [m for m in MODES[kind] if not (room == goal["room"] and m == goal.get("mode"))]
                state = {"room": room, "type": kind, "mode": rng.choice(modes)}
                if kind == "thermostat":
                    unit = rng.choice("CF")
                    state.update(temp=rng.randint(*TEMPS[unit]), unit=unit)
                    if state["temp"] == goal.get("value"):
                        state["temp"] -= 1
                devices[new_id(rng, "dev", taken)] = state
        return HomeBackend(devices)

    def checks(self, backend: HomeBackend, goal: dict) -> dict[str, bool]:
        target = next(i for i, d in backend.devices.items()
                      if d["room"] == goal["room"] and d["type"] == goal["device"])
        device = backend.devices[target]
        changes = [(k, name) for k, (name, _) in enumerate(backend.log) if name.startswith("set_")]
        others_untouched = all(backend.log[k][1]["device_id"] == target for k, _ in changes)
        if goal["kind"] == "status":
            facts = [str(device["temp"]), device["unit"]] if "temp" in device else [device["mode"]]
            return {
                "looked_up": any(a["device_id"] == target for a in backend.called("get_status")),
                "answer": all(answer_has(backend.final_answer, fact) for fact in facts),
                "no_changes": not changes,
            }
        if goal["kind"] == "switch":
            return {"mode": device["mode"] == goal["mode"], "others_untouched": others_untouched,
                    "single_change": len(changes) == 1}
        first = {name: min((k for k, n in changes if n == name), default=None)
                 for name in ("set_mode", "set_temperature")}
        return {
            "mode": device["mode"] == goal["mode"],
            "temperature": (device.get("temp"), device.get("unit")) == (goal["value"], goal["unit"]),
            "mode_first": first["set_mode"] is not None and first["set_temperature"] is not None
            and first["set_mode"] < first["set_temperature"],
            "others_untouched": others_untouched,
        }

    @staticmethod
    def _known(done: Done, room: str, kind: str) -> str | None:
        for args, res in results(done, "list_devices"):
            if args["room"].strip().lower() == room:
                return next((d["id"] for d in res["devices"] if d["type"] == kind), None)
        return None

    def next_step(self, goal: dict, done: Done) -> Step:
        target = self._known(done, goal["room"], goal["device"])
        if target is None:
            return "list_devices", {"room": goal["room"]}
        if goal["kind"] == "status":
            seen = [r for a, r in results(done, "get_status") if a["device_id"] == target]
            if not seen:
                return "get_status", {"device_id": target}
            status = seen[-1]
            if "temp" in status:
                return f"It is set to {status['temp']} {status['unit']}."
            return f"It is {status['mode']}."
        mode = {"device_id": target, "mode": goal["mode"]}
        if mode not in [a for a, _ in results(done, "set_mode")]:
            return "set_mode", mode
        if goal["kind"] == "climate" and not any(a["device_id"] == target for a, _ in results(done, "set_temperature")):
            return "set_temperature", {"device_id": target, "value": goal["value"], "unit": goal["unit"]}
        return "Done."

    def mistakes(self, goal: dict, done: Done, step: Step, rng: random.Random) -> list[str]:
        if isinstance(step, str):
            if goal["kind"] == "status" and goal["device"] == "thermostat":
                return [step.rsplit(" ", 1)[0] + "."]  # forgets the unit
            return []
        name, args = step
        if name == "list_devices":
            return [call(name, room=args["room"] + "s")]
        if name == "set_mode":
            misread = rng.choice([m for m in MODES[goal["device"]] if m != args["mode"]])
            bad = [call(name, **{**args, "mode": args["mode"] + "ing"}), call(name, **{**args, "mode": misread})]
            if goal["kind"] == "climate":
                bad.append(call("set_temperature", device_id=args["device_id"], value=goal["value"], unit=goal["unit"]))
            else:
                other = next(d["id"] for _, res in results(done, "list_devices") for d in res["devices"]
                             if d["id"] != args["device_id"])
                bad.append(call(name, device_id=other, mode=args["mode"]))
            return bad
        if name == "set_temperature":
            return [call(name, device_id=args["device_id"], value=args["value"]),
                    call(name, **{**args, "unit": "F" if args["unit"] == "C" else "C"}),
                    call(name, **{**args, "value": f"{args['value']}°{args['unit']}"})]
        return []
