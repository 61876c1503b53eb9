"""The child side of grading: call the candidate on each argument list, print what it returned.

This file's text is the program :mod:`lopd.envs.code.grading` runs in the sandbox (as
``__main__``); the parent imports it only for :func:`encode` / :func:`decode`, so both sides
share one codec. Stdlib only, no package imports: it runs under ``python -I -S``.

Protocol. stdin: one JSON object ``{"nonce", "prelude", "code", "entry_point", "calls"}`` where
``prelude`` is the task prompt (its imports and helper functions), ``code`` the candidate and
``calls`` the encoded ``[args, kwargs]`` of each test call. No expected value is ever sent.
stdout: one line ``<nonce> <json>`` per call, ``{"i": k, "value": <encoded>}`` or
``{"i": k, "error": "Type: message"}``, or a single ``{"load_error": ...}``.

What this does not try to do: hide anything from the candidate. The candidate runs in this
process and can read the nonce, patch the codec or print any line it likes. That buys it
nothing: a line can only *claim a return value*, the parent compares it with an expected value
the child never sees, and the parent decodes JSON into plain values only (an object with a
custom ``__eq__`` cannot cross). The nonce only keeps the candidate's own prints (which go to a
sink anyway, unless it writes to fd 1 itself) from being mistaken for results.

Codec: None, bool, int, float and str as JSON; a list as a JSON array; ``{"tuple": [...]}``
and ``{"dict": [[k, v], ...]}`` for tuples and dicts (JSON would lose tuple-ness and key
types). Anything else, subclasses included, is a type error, reported as the call's failure.
"""

import io
import json
import sys

MAX_DEPTH = 64  # nesting of containers in a value
ERROR_CHARS = 200  # an exception's description, cut


def encode(value, depth=0):
    """A plain value → JSON-able data; TypeError for anything that is not exactly a plain type."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if depth >= MAX_DEPTH:
        raise TypeError(f"value nested deeper than {MAX_DEPTH}")
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"returned a {kind.__name__}, not a plain value (None/bool/int/float/str/list/tuple/dict)")


def decode(data, depth=0):
    """Inverse of :func:`encode`; ValueError for anything malformed."""
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if depth >= MAX_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_DEPTH}")
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1 and type(data.get("tuple")) is list:
        return tuple(decode(v, depth + 1) for v in data["tuple"])
    if kind is dict and len(data) == 1 and type(data.get("dict")) is list:
        out = {}
        for pair in data["dict"]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict item")
            key = decode(pair[0], depth + 1)
            try:
                out[key] = decode(pair[1], depth + 1)
            except TypeError:
                raise ValueError("unhashable dict key") from None
        return out
    raise ValueError(f"malformed encoded value of type {kind.__name__}")


def describe(exc):
    """``Type: last line of the message``, cut: the last line of a traceback."""
    try:
        lines = str(exc).strip().splitlines()
    except BaseException:  # noqa: BLE001 - a candidate's exception may break __str__ on purpose
        lines = []
    text = f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__
    return text[:ERROR_CHARS]


class _Sink(io.TextIOBase):
    """Where the candidate's prints go: nowhere (they would only eat the output cap)."""

    def writable(self):
        return True

    def write(self, s):
        return len(s)


def main():
    import builtins
    payload = json.loads(sys.stdin.read())
    nonce, entry, out = payload["nonce"], payload["entry_point"], sys.stdout

    def emit(obj):
        out.write(f"\n{nonce} {json.dumps(obj)}\n")
        out.flush()

    sys.stdout = sys.stderr = _Sink()
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(payload["prelude"], "<prompt>", "exec"), ns)
        stub = ns.get(entry)
        exec(compile(payload["code"], "<candidate>", "exec"), ns)
        fn = ns.get(entry)
        if fn is stub or not callable(fn):
            raise NameError(f"the code does not define {entry}()")
    except BaseException as exc:  # noqa: BLE001 - SystemExit and friends are the candidate's failures too
        emit({"load_error": describe(exc)})
        return
    for i, call in enumerate(payload["calls"]):
        try:
            args, kwargs = decode(call[0]), decode(call[1])
            line = json.dumps({"i": i, "value": encode(fn(*args, **kwargs))})
        except BaseException as exc:  # noqa: BLE001
            line = json.dumps({"i": i, "error": describe(exc)})
        out.write(f"\n{nonce} {line}\n")
        out.flush()


if __name__ == "__main__":
    main()
