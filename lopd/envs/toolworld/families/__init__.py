"""The ToolWorld task families, by name; each has several apps with their own conventions."""

from .banking import Banking
from .base import Backend, Family, Tool, ToolError
from .calendar import Calendar
from .shop import Shop
from .smarthome import SmartHome

REGISTRY: dict[str, Family] = {f.name: f for f in (Banking(), Calendar(), Shop(), SmartHome())}

__all__ = ["REGISTRY", "Backend", "Family", "Tool", "ToolError"]
