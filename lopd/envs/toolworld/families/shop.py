"""Shop: find product ids, fill the cart, check out with the total shown by view_cart."""

from __future__ import annotations

import random

from .base import Backend, Done, Family, Step, Tool, ToolError, call, new_id, results

NOUNS = ["mug", "lamp", "pen", "kettle", "notebook", "chair", "towel", "backpack",
         "bottle", "candle", "scarf", "pillow"]
COLOURS = ["red", "blue", "green", "black", "white", "grey", "yellow", "pink"]


class ShopBackend(Backend):
    """Products ``{id: {name, price}}``, a cart ``{id: qty}`` and placed orders."""

    def __init__(self, products: dict[str, dict], rng: random.Random) -> None:
        super().__init__()
        self.products = products
        self.cart: dict[str, int] = {}
        self.orders: list[dict] = []
        self._rng = rng
        self._ids = set(products)

    def total(self) -> int:
        return sum(self.products[i]["price"] * q for i, q in self.cart.items())

    def tool_search_products(self, query: str) -> dict:
        q = query.strip().lower()
        found = [{"name": p["name"], "id": i} for i, p in self.products.items() if q and q in p["name"]]
        if not found:
            raise ToolError(f"no products match {query}")
        return {"products": found[:3]}

    def tool_add_to_cart(self, product_id: str, quantity: int) -> dict:
        if product_id not in self.products:
            raise ToolError(f"unknown product id {product_id}")
        if quantity < 1:
            raise ToolError("quantity must be at least 1")
        self.cart[product_id] = self.cart.get(product_id, 0) + quantity
        return {"product_id": product_id, "in_cart": self.cart[product_id]}

    def tool_view_cart(self) -> dict:
        return {"items": [{"id": i, "qty": q} for i, q in self.cart.items()], "total_cents": self.total()}

    def tool_checkout(self, total_cents: int) -> dict:
        if not self.cart:
            raise ToolError("cart is empty")
        if total_cents != self.total():
            raise ToolError("total_cents does not match the cart")
        order = {"id": new_id(self._rng, "ord", self._ids), "items": dict(self.cart), "total": total_cents}
        self.orders.append(order)
        self.cart = {}
        return {"order_id": order["id"], "status": "placed"}


class Shop(Family):
    name = "shop"
    prefix = "shop"
    tools = (
        Tool("search_products", {"query": "str"}, "find product ids by name"),
        Tool("add_to_cart", {"product_id": "str", "quantity": "int"}, "add a product to the cart"),
        Tool("view_cart", {}, "cart items and total in cents"),
        Tool("checkout", {"total_cents": "int"}, "place the order"),
    )
    rules = "Search by product type. Before checkout call view_cart and pass its total_cents."

    def sample_goal(self, rng: random.Random) -> tuple[str, dict]:
        checkout = rng.random() < 0.5
        nouns = rng.sample(NOUNS, 1 if checkout or rng.random() < 0.4 else 2)
        items = [[f"{rng.choice(COLOURS)} {n}", rng.randint(1, 4)] for n in nouns]
        listed = " and ".join(f"{q} of the {name}" for name, q in items)
        text = f"Buy {listed} and check out." if checkout else f"Put {listed} in my cart. Do not check out."
        return text, {"items": items, "checkout": checkout}

    def make_backend(self, goal: dict, rng: random.Random) -> ShopBackend:
        names: list[str] = []
        for name, _ in goal["items"]:
            noun = name.split()[1]
            others = rng.sample([c for c in COLOURS if c not in name], rng.randint(1, 2))
            variants = [name] + [f"{c} {noun}" for c in others]
            rng.shuffle(variants)
            names += variants
        names += [f"{rng.choice(COLOURS)} {n}" for n in rng.sample(NOUNS, 2)
                  if all(n not in x for x in names)]
        taken: set[str] = set()
        return ShopBackend({new_id(rng, "prd", taken): {"name": n, "price": rng.randint(199, 9999)}
                            for n in dict.fromkeys(names)}, rng)

    def checks(self, backend: ShopBackend, goal: dict) -> dict[str, bool]:
        bought = backend.orders[-1]["items"] if backend.orders else backend.cart
        names = {backend.products[i]["name"]: q for i, q in bought.items()}
        wanted = dict((n, q) for n, q in goal["items"])
        return {
            "products": set(wanted) <= set(names),
            "quantities": all(names.get(n) == q for n, q in wanted.items()),
            "no_extra_items": set(names) <= set(wanted),
            "checkout": len(backend.orders) == (1 if goal["checkout"] else 0),
        }

    @staticmethod
    def _name(done: Done, ident: str) -> str:
        return next(p["name"] for _, res in results(done, "search_products") for p in res["products"]
                    if p["id"] == ident)

    @staticmethod
    def _known(done: Done, name: str) -> str | None:
        for _, res in results(done, "search_products"):
            for product in res["products"]:
                if product["name"] == name:
                    return product["id"]
        return None

    def next_step(self, goal: dict, done: Done) -> Step:
        added = {args["product_id"] for args, _ in results(done, "add_to_cart")}
        for name, qty in goal["items"]:
            ident = self._known(done, name)
            if ident is None:
                return "search_products", {"query": name.split()[1]}
            if ident not in added:
                return "add_to_cart", {"product_id": ident, "quantity": qty}
        if not goal["checkout"] or results(done, "checkout"):
            return "Done."
        # The cart view must come after the last change to the cart.
        last_add = max((k for k, (c, _) in enumerate(done) if c["name"] == "add_to_cart"), default=-1)
        views = [r for k, (c, r) in enumerate(done) if c["name"] == "view_cart" and k > last_add]
        if not views:
            return "view_cart", {}
        return "checkout", {"total_cents": views[-1]["total_cents"]}

    def mistakes(self, goal: dict, done: Done, step: Step, rng: random.Random) -> list[str]:
        if isinstance(step, str):
            return []
        name, args = step
        if name == "search_products":
            return [call(name, query=args["query"] + "s")]
        if name == "add_to_cart":
            ident, qty = args["product_id"], args["quantity"]
            noun = self._name(done, ident).split()[1]
            namesakes = [p["id"] for _, res in results(done, "search_products") for p in res["products"]
                         if p["name"].endswith(noun) and p["id"] != ident]
            bad = [call(name, product_id=ident, quantity=qty + 1), call(name, product_id=ident, quantity=str(qty))]
            return bad + [call(name, product_id=i, quantity=qty) for i in namesakes[:1]]
        if name == "view_cart":  # checks out blind, or adds the last item a second time
            again = next(a for a, _ in reversed(results(done, "add_to_cart")))
            return [call("checkout", total_cents=rng.randint(199, 9999)), call("add_to_cart", **again)]
        if name == "checkout":
            total = args["total_cents"]
            return [call(name, total_cents=total / 100), call(name, total_cents=total // 100)]
        return []
