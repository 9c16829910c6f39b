"""The one corpus of edge numbers every business-JSON test uses (payloads, results, effect
results, workflow input/output, signal payloads, in the server and in the SDK).

Business JSON is stored and returned as the exact text received (docs/invariants.md,
"Business JSON keeps its numbers"): none of these may be refused, rounded, re-spelled or
turned into a string anywhere — not when a worker reports it as a result, not when the
server digests a report, not when a workflow copies it from a step's output into its own.
"""

from __future__ import annotations

#: Number spellings a float round trip (or a parser limited to doubles) would change or refuse.
EDGE_NUMBERS: list[str] = [
    "1e400",  # beyond the double range
    "-1e400",
    "1e-400",  # below it (a double would make it 0)
    "-0",
    "-0.0",
    "10.10",  # trailing zero
    "1E+2",  # upper-case exponent with a sign
    "1e5",
    "123456789012345678901234567890",  # beyond 64-bit integers
    "-98765432109876543210.000000000000000000001",
    "9007199254740993",  # 2^53 + 1
    "0.1",
    "2.5000",
    "1e308",
    "3.141592653589793238462643383279502884197",
]

#: One JSON document holding every edge number, with odd spacing (kept byte for byte).
EDGE_DOC: bytes = (
    b'{"numbers": ['
    + b", ".join(n.encode() for n in EDGE_NUMBERS)
    + b'],  "money" :10.10, "nested": {"big": 1e400, "zero": -0}, "text": "10.10"}'
)


def number_texts(data: bytes) -> list[str]:
    """Every number in ``data`` as spelled (a scan outside strings, for assertions)."""
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        c = data[i : i + 1]
        if c == b'"':
            i += 1
            while i < n and data[i : i + 1] != b'"':
                i += 2 if data[i : i + 1] == b"\\" else 1
            i += 1
        elif c in b"-0123456789":
            j = i + 1
            while j < n and data[j : j + 1] in b"0123456789.eE+-":
                j += 1
            out.append(data[i:j].decode())
            i = j
        else:
            i += 1
    return out


#: The numbers of EDGE_DOC, in order, as spelled.
EDGE_DOC_NUMBERS: list[str] = number_texts(EDGE_DOC)
