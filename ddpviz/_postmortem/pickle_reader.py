"""A small pickle interpreter for Flight Recorder dumps: plain data only, bounded while parsing.

torch's `_dump_fr_trace` pickles a dict of dicts, lists, 2-tuples, strings, ints, bools and
None (protocol 2); Python's pickler writes the same data with protocol 3-5 opcodes (FRAME,
MEMOIZE, SHORT_BINUNICODE). This interpreter runs exactly those opcodes and refuses every other
one by name, so no class or function is ever looked up (GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
persistent ids and extension codes are simply not in the table).

`pickle.Unpickler` applies no bound until it is done: a 9-byte pickle can make it allocate a
64 GiB memo, a list flood fills memory, and a DAG of shared tuples used as a dict key makes
hashing run for ever inside one C call that Ctrl-C cannot interrupt. Here, while parsing:
at most MAX_OPS opcodes run (so a 256 MiB file takes seconds, not minutes), memo indices are
below MAX_OPS (the memo is a dict, never sized by an index), an estimate of the bytes built
(bookkeeping included) is budgeted, strings and ints have a size limit, dict
keys are str or int only, nesting is at most MAX_DEPTH deep, and a container placed inside
another is never modified again (so no cycles, and every container's depth is final). The loop
is plain Python: an interrupt stops it at once.
"""

from __future__ import annotations

import struct
from typing import Any

MAX_OPS = 16_000_000  # opcodes run (a real dump: about 100 per entry), and memo indices
MAX_BYTES = 1 << 30  # estimated bytes of everything built
MAX_DEPTH = 64  # containers inside containers (a real dump: 5)
MAX_STRING_BYTES = 32 << 20  # one string (a process group's rank list is a JSON string)
MAX_INT_BYTES = 32  # one LONG1/LONG4 int (real dumps: 64-bit ids and times)

# Estimated bytes per object built (CPython 3.11, 64-bit), measured with over-allocation and
# this module's own bookkeeping (a container's depth entry): a container, a number, a slot
# holding a reference (stack, list, tuple, memo), a dict item; a string costs 64 + 4 per byte.
_COST_CONTAINER = 200
_COST_SCALAR = 48
_COST_SLOT = 16
_COST_DICT_ITEM = 48


class PickleRefused(ValueError):
    """A pickle this interpreter does not run (the message says why)."""


class _Mark:
    """The MARK opcode's stack marker."""


_MARK = _Mark()
_I1, _I2, _I4, _I8 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<i"), \
    struct.Struct("<Q")
_U4, _F8 = struct.Struct("<I"), struct.Struct(">d")


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.pos = 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.bytes = 0
        # id -> depth of each container built, negated once it is placed inside another
        # (frozen). A dropped container's id may be reused: creating a container resets it.
        self.depth: dict[int, int] = {}

    # --- bounds -------------------------------------------------------------------------------

    def refuse(self, what: str) -> PickleRefused:
        return PickleRefused(f"{what} (at byte {self.pos:,})")

    def take(self, nbytes: int) -> None:
        self.bytes += nbytes
        if self.bytes > MAX_BYTES:
            raise self.too_big()

    def too_big(self) -> PickleRefused:
        return self.refuse(f"it builds more than about {MAX_BYTES >> 20:,} MiB of objects; a "
                           "Flight Recorder dump is far smaller")

    def read(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise self.refuse("the pickle ends in the middle of an opcode")
        out = bytes(self.data[self.pos:end])
        self.pos = end
        return out

    def container(self, obj: Any) -> Any:
        self.take(_COST_CONTAINER)
        self.depth[id(obj)] = 1
        return obj

    def place(self, parent: Any, child: Any) -> None:
        """`child` goes inside `parent`: it is frozen; the parent's depth follows."""
        if type(child) not in _CONTAINERS:
            return
        if child is parent:
            raise self.refuse(f"a {type(parent).__name__} placed inside itself")
        key = id(child)
        d = abs(self.depth[key])
        self.depth[key] = -d
        if d + 1 > MAX_DEPTH:
            raise self.refuse(f"containers nested more than {MAX_DEPTH} deep")
        if d + 1 > self.depth[id(parent)]:
            self.depth[id(parent)] = d + 1

    def mutable(self, obj: Any, kind: type) -> Any:
        if type(obj) is not kind:
            raise self.refuse(f"an item added to a {type(obj).__name__}, expected a "
                              f"{kind.__name__}")
        if self.depth[id(obj)] < 0:
            raise self.refuse(f"a {kind.__name__} modified after it was placed in another "
                              "container (a cycle, or a shared container changed)")
        return obj

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise self.refuse("an opcode needs a MARK and there is none")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def pop(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.refuse("an opcode needs a value and the stack is empty")
        return self.stack.pop()

    # --- building -----------------------------------------------------------------------------

    def string(self, n: int) -> None:
        if n > MAX_STRING_BYTES:
            raise self.refuse(f"a string of {n:,} bytes, more than {MAX_STRING_BYTES:,}")
        raw = self.read(n)
        try:
            text = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise self.refuse(f"a string that is not UTF-8 ({e.reason})") from None
        self.take(64 + 4 * n)
        self.stack.append(text)

    def long(self, n: int) -> None:
        if n > MAX_INT_BYTES:
            raise self.refuse(f"an integer of {n:,} bytes, more than {MAX_INT_BYTES}")
        self.take(_COST_SCALAR)
        self.stack.append(int.from_bytes(self.read(n), "little", signed=True))

    def tuple_of(self, items: list[Any]) -> None:
        t = self.container(tuple(items))
        self.take(_COST_SLOT * len(items))
        for x in items:
            self.place(t, x)
        self.stack.append(t)

    def append(self, items: list[Any]) -> None:
        target = self.mutable(self.pop(), list)
        self.take(_COST_SLOT * len(items))
        for x in items:
            self.place(target, x)
        target.extend(items)
        self.stack.append(target)

    def setitems(self, items: list[Any]) -> None:
        if len(items) % 2:
            raise self.refuse("SETITEMS with an odd number of values")
        target = self.mutable(self.pop(), dict)
        self.take(_COST_DICT_ITEM * (len(items) // 2))
        for i in range(0, len(items), 2):
            key, value = items[i], items[i + 1]
            if type(key) is not str and type(key) is not int:  # no hashing of anything else
                raise self.refuse(f"a dict key of type {type(key).__name__}; Flight Recorder "
                                  "dumps have str keys")
            self.place(target, value)
            target[key] = value
        self.stack.append(target)

    def memo_index(self, index: int) -> int:
        if index >= MAX_OPS:
            raise self.refuse(f"memo index {index:,}, more than {MAX_OPS:,}")
        return index

    def put(self, index: int) -> None:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.refuse("PUT with an empty stack")
        if index not in self.memo:
            self.take(_COST_DICT_ITEM)
        self.memo[self.memo_index(index)] = self.stack[-1]

    def get(self, index: int) -> None:
        try:
            self.stack.append(self.memo[index])
        except KeyError:
            raise self.refuse(f"memo index {index:,} read before it was written") from None
        self.take(_COST_SLOT)

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> Any:
        data, n, table = self.data, len(self.data), _TABLE
        if n < 2 or data[0] != 0x80:
            raise self.refuse("not a pickle of protocol 2 to 5 (they start with PROTO, 0x80)")
        ops = 0
        while self.pos < n:
            ops += 1
            if ops > MAX_OPS:
                raise self.refuse(f"more than {MAX_OPS:,} opcodes; a Flight Recorder dump has "
                                  "about 100 per entry")
            at = self.pos
            code = data[at]
            self.pos = at + 1
            op = table[code]
            if op is None:
                raise PickleRefused(f"opcode {_name(code)} at byte {at:,} is not one a Flight "
                                    "Recorder dump uses (dumps hold only dicts, lists, tuples, "
                                    "strings, numbers, bools and None)")
            if op(self):
                if len(self.stack) != 1 or self.marks:
                    raise self.refuse("STOP with a stack not holding exactly one value")
                return self.stack[0]
        raise self.refuse("the pickle ends without a STOP opcode")


def _op_proto(r: _Reader) -> None:
    version = r.read(1)[0]
    if not 2 <= version <= 5:
        raise r.refuse(f"pickle protocol {version}; Flight Recorder dumps use 2 to 5")


def _op_frame(r: _Reader) -> None:
    r.read(8)  # a length hint for buffering: the data is already in memory


def _op_mark(r: _Reader) -> None:
    r.take(_COST_SLOT)
    r.marks.append(len(r.stack))


def _push(value: Any) -> Any:
    def op(r: _Reader) -> None:
        r.bytes += _COST_SLOT
        if r.bytes > MAX_BYTES:
            raise r.too_big()
        r.stack.append(value)
    return op


def _new(kind: type) -> Any:
    def op(r: _Reader) -> None:
        r.bytes += _COST_CONTAINER
        if r.bytes > MAX_BYTES:
            raise r.too_big()
        obj = kind()
        r.depth[id(obj)] = 1
        r.stack.append(obj)
    return op


def _op_binint(r: _Reader) -> None:
    r.take(_COST_SCALAR)
    r.stack.append(_I4.unpack(r.read(4))[0])


def _op_binint1(r: _Reader) -> None:
    r.take(_COST_SCALAR)
    r.stack.append(r.read(1)[0])


def _op_binint2(r: _Reader) -> None:
    r.take(_COST_SCALAR)
    r.stack.append(_I2.unpack(r.read(2))[0])


def _op_binfloat(r: _Reader) -> None:
    r.take(_COST_SCALAR)
    r.stack.append(_F8.unpack(r.read(8))[0])


_OPS: dict[int, Any] = {
    0x80: _op_proto,  # PROTO
    0x95: _op_frame,  # FRAME
    ord("."): lambda r: True,  # STOP
    ord("("): _op_mark,  # MARK
    ord("N"): _push(None),  # NONE
    0x88: _push(True),  # NEWTRUE
    0x89: _push(False),  # NEWFALSE
    ord("J"): _op_binint,  # BININT
    ord("K"): _op_binint1,  # BININT1
    ord("M"): _op_binint2,  # BININT2
    0x8A: lambda r: r.long(r.read(1)[0]),  # LONG1
    0x8B: lambda r: r.long(_U4.unpack(r.read(4))[0]),  # LONG4
    ord("G"): _op_binfloat,  # BINFLOAT
    ord("X"): lambda r: r.string(_U4.unpack(r.read(4))[0]),  # BINUNICODE
    0x8C: lambda r: r.string(r.read(1)[0]),  # SHORT_BINUNICODE
    0x8D: lambda r: r.string(_I8.unpack(r.read(8))[0]),  # BINUNICODE8
    ord("}"): _new(dict),  # EMPTY_DICT
    ord("]"): _new(list),  # EMPTY_LIST
    ord(")"): lambda r: r.tuple_of([]),  # EMPTY_TUPLE
    ord("t"): lambda r: r.tuple_of(r.pop_mark()),  # TUPLE
    0x85: lambda r: r.tuple_of([r.pop()]),  # TUPLE1
    0x86: lambda r: r.tuple_of(list(reversed([r.pop(), r.pop()]))),  # TUPLE2
    0x87: lambda r: r.tuple_of(list(reversed([r.pop(), r.pop(), r.pop()]))),  # TUPLE3
    ord("a"): lambda r: r.append([r.pop()]),  # APPEND
    ord("e"): lambda r: r.append(r.pop_mark()),  # APPENDS
    ord("s"): lambda r: r.setitems(list(reversed([r.pop(), r.pop()]))),  # SETITEM
    ord("u"): lambda r: r.setitems(r.pop_mark()),  # SETITEMS
    ord("q"): lambda r: r.put(r.read(1)[0]),  # BINPUT
    ord("r"): lambda r: r.put(r.memo_index(_U4.unpack(r.read(4))[0])),  # LONG_BINPUT
    0x94: lambda r: r.put(r.memo_index(len(r.memo))),  # MEMOIZE
    ord("h"): lambda r: r.get(r.read(1)[0]),  # BINGET
    ord("j"): lambda r: r.get(_U4.unpack(r.read(4))[0]),  # LONG_BINGET
}


def _refuse_global(r: _Reader, module: object, name: object) -> None:
    def plain(x: object) -> str:
        return x if isinstance(x, str) and len(x) <= 200 and x.isprintable() else "?"
    raise PickleRefused(f"refused to load {plain(module)}.{plain(name)}: dumps hold only plain "
                        "data, so this file is not one torch wrote (or was tampered with). Do "
                        "not load it with pickle")


def _op_global(r: _Reader) -> None:
    def line() -> str:
        end = bytes(r.data[r.pos:r.pos + 256]).find(b"\n")
        return "?" if end < 0 else r.read(end + 1)[:-1].decode("utf-8", "replace")
    _refuse_global(r, line(), line())


def _op_stack_global(r: _Reader) -> None:
    top = r.stack[-2:] if len(r.stack) >= 2 else ["?", "?"]
    _refuse_global(r, top[0], top[1])


_OPS[ord("c")] = _op_global  # GLOBAL: refused, naming what it asked for
_OPS[0x93] = _op_stack_global  # STACK_GLOBAL: likewise


_TABLE: list[Any] = [_OPS.get(code) for code in range(256)]
_CONTAINERS = (list, dict, tuple)


def _name(code: int) -> str:
    import pickletools  # only for the message

    op = next((o for o in pickletools.opcodes if ord(o.code.encode("latin-1")) == code), None)
    return f"{op.name} (0x{code:02x})" if op is not None else f"0x{code:02x} (no such opcode)"


def load_plain(data: bytes | bytearray | memoryview) -> Any:
    """The plain data (dicts with str/int keys, lists, tuples, str, int, float, bool, None)
    a Flight Recorder pickle holds. Raises PickleRefused saying what it met and where."""
    return _Reader(data).run()
