"""Deliberate mistakes that type checkers must report, one per `# expect:` line.

`# expect: <pyright rule> | <mypy code>` (`-`: none). Checked by tests/test_typing.py,
also on a copy with `eqx.Module` as the base, which must give the same diagnostics.
Neither checker reports `point.x = 2.0` (Equinox does not declare modules frozen to
type checkers, so that `self.x = ...` in a custom `__init__` type-checks).
"""

import equinox as eqx

import autostatic as asx


class Point(asx.AutoModule):
    x: float
    y: float = 0.0


class Custom(asx.AutoModule):
    n: int

    def __init__(self, n: int) -> None:
        self.n = n

    def times(self, k: int) -> int:
        return self.n * k


class Scaled(asx.AutoModule):
    scale: int = eqx.field(converter=int)


class Point3(Point):
    z: float = 0.0


Point()  # expect: reportCallIssue | call-arg
Point(x="one")  # expect: reportArgumentType | arg-type
Point(x=1.0, w=2.0)  # expect: reportCallIssue | call-arg
Point(1.0, 2.0, 3.0)  # expect: reportCallIssue | call-arg
Point(x=1.0).w  # expect: reportAttributeAccessIssue | attr-defined
Custom(n=1, m=2)  # expect: reportCallIssue | call-arg
Custom("n")  # expect: reportArgumentType | arg-type
Scaled(scale=[1, 2])  # expect: reportArgumentType | arg-type
Point3(1.0, z="z")  # expect: reportArgumentType | arg-type
Custom(1).times("k")  # expect: reportArgumentType | arg-type
Custom(1).plus(1)  # expect: reportAttributeAccessIssue | attr-defined
Point(x=1.0).w = 2.0  # expect: reportAttributeAccessIssue | attr-defined
