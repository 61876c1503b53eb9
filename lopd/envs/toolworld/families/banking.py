"""Banking: look up account ids, move money in integer cents, confirm every transfer."""

from __future__ import annotations

import random

from .base import (FIRST_NAMES, Backend, Done, Family, Step, Tool, ToolError, answer_has, call,
                   new_id, results)

TYPES = ("checking", "savings")


class BankBackend(Backend):
    """Accounts ``{id: {owner, type, balance}}`` and transfers ``{id: {from, to, amount, confirmed}}``."""

    def __init__(self, accounts: dict[str, dict], rng: random.Random) -> None:
        super().__init__()
        self.accounts = accounts
        self.transfers: dict[str, dict] = {}
        self._rng = rng
        self._ids = set(accounts)

    def _account(self, account_id: str) -> dict:
        if account_id not in self.accounts:
            raise ToolError(f"unknown account id {account_id}")
        return self.accounts[account_id]

    def tool_find_account(self, owner: str) -> dict:
        found = [{"type": a["type"], "id": i} for i, a in self.accounts.items()
                 if a["owner"].lower() == owner.strip().lower()]
        if not found:
            raise ToolError(f"no accounts for {owner}")
        return {"accounts": found}

    def tool_get_balance(self, account_id: str) -> dict:
        return {"id": account_id, "balance_cents": self._account(account_id)["balance"]}

    def tool_transfer(self, from_id: str, to_id: str, amount_cents: int) -> dict:
        source, _ = self._account(from_id), self._account(to_id)
        if from_id == to_id:
            raise ToolError("from_id and to_id must differ")
        if amount_cents <= 0:
            raise ToolError("amount_cents must be positive")
        if amount_cents > source["balance"]:
            raise ToolError("insufficient funds")
        tid = new_id(self._rng, "tr", self._ids)
        self.transfers[tid] = {"from": from_id, "to": to_id, "amount": amount_cents, "confirmed": False}
        return {"transfer_id": tid, "status": "pending"}

    def tool_confirm_transfer(self, transfer_id: str) -> dict:
        transfer = self.transfers.get(transfer_id)
        if transfer is None:
            raise ToolError(f"unknown transfer id {transfer_id}")
        if transfer["confirmed"]:
            raise ToolError(f"transfer {transfer_id} already confirmed")
        transfer["confirmed"] = True
        self.accounts[transfer["from"]]["balance"] -= transfer["amount"]
        self.accounts[transfer["to"]]["balance"] += transfer["amount"]
        return {"transfer_id": transfer_id, "status": "confirmed"}


class Banking(Family):
    name = "banking"
    prefix = "bank"
    tools = (
        Tool("find_account", {"owner": "str"}, "ids and types of a person's accounts"),
        Tool("get_balance", {"account_id": "str"}, "balance of an account"),
        Tool("transfer", {"from_id": "str", "to_id": "str", "amount_cents": "int"}, "create a pending transfer"),
        Tool("confirm_transfer", {"transfer_id": "str"}, "execute a pending transfer"),
    )
    rules = "Look up account ids first. Amounts are integer cents ($12.50 = 1250). Confirm every transfer."

    def sample_goal(self, rng: random.Random) -> tuple[str, dict]:
        if rng.random() < 0.35:
            owner, kind = rng.choice(FIRST_NAMES), rng.choice(TYPES)
            return (f"What is the balance of {owner}'s {kind} account? Answer in cents.",
                    {"kind": "balance", "owner": owner, "type": kind})
        src, src_type = rng.choice(FIRST_NAMES), rng.choice(TYPES)
        if rng.random() < 0.3:
            dst, dst_type = src, TYPES[1 - TYPES.index(src_type)]
        else:
            dst, dst_type = rng.choice([n for n in FIRST_NAMES if n != src]), rng.choice(TYPES)
        amount = rng.randint(1, 400) * 100 + rng.choice([0, 0, 25, 50, 75, rng.randint(1, 99)])
        text = f"Send ${amount // 100}.{amount % 100:02d} from {src}'s {src_type} to {dst}'s {dst_type} account."
        return text, {"kind": "transfer", "src": src, "src_type": src_type,
                      "dst": dst, "dst_type": dst_type, "amount_cents": amount}

    def make_backend(self, goal: dict, rng: random.Random) -> BankBackend:
        owners = {goal.get("owner"), goal.get("src"), goal.get("dst")} - {None}
        distractors = rng.sample([n for n in FIRST_NAMES if n not in owners], 2)
        taken: set[str] = set()
        accounts: dict[str, dict] = {}
        for owner in sorted(owners) + distractors:
            kinds = list(TYPES) if owner in owners else rng.sample(TYPES, rng.randint(1, 2))
            rng.shuffle(kinds)
            for kind in kinds:
                accounts[new_id(rng, "acc", taken)] = {
                    "owner": owner, "type": kind, "balance": rng.randint(50_000, 900_000)}
        return BankBackend(accounts, rng)

    @staticmethod
    def _id_of(backend: BankBackend, owner: str, kind: str) -> str:
        return next(i for i, a in backend.accounts.items() if a["owner"] == owner and a["type"] == kind)

    def checks(self, backend: BankBackend, goal: dict) -> dict[str, bool]:
        if goal["kind"] == "balance":
            target = self._id_of(backend, goal["owner"], goal["type"])
            return {
                "looked_up": any(a["account_id"] == target for a in backend.called("get_balance")),
                "answer": answer_has(backend.final_answer, str(backend.accounts[target]["balance"])),
                "no_transfers": not backend.transfers,
            }
        last = list(backend.transfers.values())[-1] if backend.transfers else {}
        accounts = (self._id_of(backend, goal["src"], goal["src_type"]),
                    self._id_of(backend, goal["dst"], goal["dst_type"]))
        return {
            "accounts": (last.get("from"), last.get("to")) == accounts,
            "amount_cents": last.get("amount") == goal["amount_cents"],
            "confirmed": bool(last.get("confirmed")),
            "single_transfer": len(backend.transfers) == 1,
        }

    @staticmethod
    def _known(done: Done, owner: str, kind: str) -> str | None:
        """The id of ``owner``'s ``kind`` account if a find_account result showed it."""
        for args, res in results(done, "find_account"):
            if args["owner"].strip().lower() == owner.lower():
                for account in res["accounts"]:
                    if account["type"] == kind:
                        return account["id"]
        return None

    def next_step(self, goal: dict, done: Done) -> Step:
        if goal["kind"] == "balance":
            acc = self._known(done, goal["owner"], goal["type"])
            if acc is None:
                return "find_account", {"owner": goal["owner"]}
            seen = [r for a, r in results(done, "get_balance") if a["account_id"] == acc]
            if not seen:
                return "get_balance", {"account_id": acc}
            return f"The balance is {seen[-1]['balance_cents']} cents."
        src = self._known(done, goal["src"], goal["src_type"])
        if src is None:
            return "find_account", {"owner": goal["src"]}
        dst = self._known(done, goal["dst"], goal["dst_type"])
        if dst is None:
            return "find_account", {"owner": goal["dst"]}
        made = [r["transfer_id"] for _, r in results(done, "transfer")]
        if not made:  # a transfer that went through is taken as the one intended
            return "transfer", {"from_id": src, "to_id": dst, "amount_cents": goal["amount_cents"]}
        if not any(a["transfer_id"] == made[-1] for a, _ in results(done, "confirm_transfer")):
            return "confirm_transfer", {"transfer_id": made[-1]}
        return "Done."

    def mistakes(self, goal: dict, done: Done, step: Step, rng: random.Random) -> list[str]:
        if isinstance(step, str):
            if goal["kind"] != "balance":
                return []
            cents = int(step.split()[3])
            return [f"The balance is ${cents // 100}.{cents % 100:02d}."]
        name, args = step
        if name == "find_account":
            return [call(name, owner=args["owner"][:-1])]
        if name == "get_balance":
            other = self._known(done, goal["owner"], TYPES[1 - TYPES.index(goal["type"])])
            return [call(name, account_id=other)] if other else []
        if name == "transfer":
            amount = args["amount_cents"]
            other = self._known(done, goal["src"], TYPES[1 - TYPES.index(goal["src_type"])])
            return [
                call(name, **{**args, "amount_cents": amount // 100}),
                call(name, **{**args, "amount_cents": amount / 100}),
                call(name, from_id=args["to_id"], to_id=args["from_id"], amount_cents=amount),
            ] + ([call(name, **{**args, "from_id": other})] if other and other != args["to_id"] else [])
        if name == "confirm_transfer":  # repeats the transfer instead of confirming it
            last = next(a for a, _ in reversed(results(done, "transfer")))
            return [call("transfer", **last)]
        return []
