"""Shop apps: find a product, order it at the listed price. Hidden per app: prices in cents or
dollars, a stock check before ordering, and orders that must be confirmed."""

from __future__ import annotations

import random

from .base import Family, Tool

PRODUCTS = ("kettle", "lamp", "mug", "toaster", "blender", "kettlebell", "backpack", "umbrella",
            "notebook", "headphones", "blanket", "candle", "teapot", "scarf", "pillow", "bottle")


class Shop(Family):
    name = "shop"
    prefix = "shop"
    apps = ("Cornershop", "Bazaar", "Emporium", "Mercato", "Depot", "Outlet", "Kiosk", "Arcade")
    formats = ("cents", "dollars")
    literal_format = "dollars"
    tools = (
        Tool("find_product", {"name": "str"}, "lookup"),
        Tool("check_stock", {"product_id": "str"}, "prereq"),
        Tool("order", {"product_id": "str", "quantity": "int", "unit_price": "int"}, "main"),
        Tool("confirm_order", {"order_id": "str"}, "commit"),
    )
    entity_noun, entity_prefix, record_prefix = "product", "prd", "ord"
    prereq_word, prereq_error = "in_stock", "check the stock first"
    words = PRODUCTS

    def sample_goal(self, rng: random.Random, app: str) -> tuple[str, dict]:
        product, quantity = rng.choice(PRODUCTS), rng.randint(1, 30)
        return (f"At {app}, order {quantity} of the {product}.",
                {"app": app, "product": product, "quantity": quantity})

    def entity_key(self, goal: dict) -> str:
        return goal["product"]

    def lookup_args(self, goal: dict) -> dict:
        return {"name": goal["product"]}

    def extras(self, rng: random.Random) -> dict:
        return {"price": rng.randint(2, 60)}

    def main_args(self, goal: dict, fmt: str, ident: str, found: dict) -> dict:
        price = found["price"] * (100 if fmt == "cents" else 1)
        return {"product_id": ident, "quantity": goal["quantity"], "unit_price": price}
