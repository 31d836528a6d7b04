"""Python's and NumPy's global random states read as their memory (issue 55: peer heal sends them at every step).
``random.getstate()`` builds 625 Python ints (9 us) and ``numpy.random.get_state()`` copies its twister through
Python (33 us); their memory is read in about a microsecond. Each layout is checked before use against the
generators' own getters, on a private instance through several draws and on the global one; where a check fails
(another interpreter, another NumPy, a getter bound to something else), the getters are used."""
from __future__ import annotations

import array
import ctypes
import random
import struct
import sys
import sysconfig
from typing import Any, Optional, Tuple

_WORDS = 624  # the Mersenne twister's words, in both
_HEAD = object.__basicsize__  # where a C object's own fields start (after its reference count and type)
# Only where id() is an address and the GIL makes a read whole (a free-threaded build's draws in another thread
# could tear it; getstate() takes a lock there).
_MEMORY = sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED")


class PythonRaw:
    """``random``'s global generator (the instance its module functions are bound to): CPython's RandomObject is
    {PyObject_HEAD; int index; uint32_t state[624]}, and ``gauss_next`` an attribute."""

    def __init__(self) -> None:
        self.inst: Any = getattr(random.getstate, "__self__", None)
        self.ok = _MEMORY and isinstance(self.inst, random.Random) and all(  # (never a read past another object)
            type(i).__basicsize__ >= _HEAD + 4 + 4 * _WORDS and self._matches(i)
            for i in (*_drawn(random.Random(7), "random"), self.inst))

    def _matches(self, inst: Any) -> bool:
        version, internal, gauss = inst.getstate()
        return self.decode((_memory(id(inst) + _HEAD, 4 + 4 * _WORDS), inst.gauss_next)) == (
            version, array.array("I", internal).tobytes(), gauss)

    def read(self) -> Tuple[Any, ...]:
        """What to compare with the last reading: the memory and gauss_next, else (the layout did not check out)
        random.getstate()."""
        if not self.ok:
            return random.getstate()
        return _memory(id(self.inst) + _HEAD, 4 + 4 * _WORDS), self.inst.gauss_next

    @staticmethod
    def decode(token: Tuple[Any, ...]) -> Tuple[int, bytes, Optional[float]]:
        """(version, the 625 words as getstate() orders them, as uint32 bytes, gauss_next)."""
        if len(token) == 3:
            return token[0], array.array("I", token[1]).tobytes(), token[2]
        raw, gauss = token
        return 3, raw[4:] + raw[:4], gauss


class NumpyRaw:
    """NumPy's global RandomState: its MT19937's state {uint32_t key[624]; int pos} (the bit generator's
    ``ctypes.state_address``), and the legacy Gaussian cache {int has_gauss; double gauss} inside the RandomState
    object, at an offset found on a private instance (the one offset where both follow every draw)."""

    def __init__(self, numpy: Any) -> None:
        self.numpy = numpy
        self.inst: Any = getattr(numpy.random.get_state, "__self__", None)
        self.bitgen: Any = None
        self.address, self.aug, self.ok = 0, -1, False
        try:
            kind = numpy.random.RandomState
            self.ok = _MEMORY and isinstance(self.inst, kind) and type(self.inst).__basicsize__ >= 32
            self.aug = _gauss_offset(numpy) if self.ok else -1
            self.ok = self.aug >= 0 and self._attach() and all(self._matches(r) for r in _drawn(kind(7), "numpy"))
        except Exception:  # (any surprise: the getters, as before)
            self.ok = False

    def _attach(self) -> bool:
        self.bitgen = getattr(self.inst, "_bit_generator", None)
        if type(self.bitgen).__name__ != "MT19937" or not self._matches(self.inst):
            self.bitgen = None
        else:
            self.address = self.bitgen.ctypes.state_address  # (a namedtuple made at each call: read once)
        return self.bitgen is not None

    def _memory(self, inst: Any, address: int) -> Tuple[bytes, bytes]:
        return _memory(address, 4 * _WORDS + 4), _memory(id(inst) + self.aug, 16)

    def _matches(self, inst: Any) -> bool:
        name, keys, pos, has_gauss, gauss = inst.get_state()
        return name == "MT19937" and self.decode(self._memory(inst, inst._bit_generator.ctypes.state_address)) == (
            keys.astype("uint32").tobytes(), ["MT19937", pos, has_gauss, gauss])

    def read(self) -> Tuple[Any, ...]:
        """What to compare with the last reading: the twister's memory and the Gaussian cache's, else (the layout did
        not check out, or the global generator's bit generator is of another kind) get_state()'s."""
        if self.aug >= 0 and self.inst._bit_generator is not self.bitgen:  # (numpy.random.set_bit_generator)
            self.ok = self._attach()
        if not self.ok:
            name, keys, pos, has_gauss, gauss = self.numpy.random.get_state()
            return name, keys.astype("uint32").tobytes(), int(pos), int(has_gauss), float(gauss)
        return self._memory(self.inst, self.address)

    @staticmethod
    def decode(token: Tuple[Any, ...]) -> Tuple[bytes, list]:
        """(the key words as uint32 bytes, [name, pos, has_gauss, gauss] as get_state() gives them)."""
        if len(token) == 5:
            return token[1], [token[0], *token[2:]]
        state, aug = token
        has_gauss, _, gauss = struct.unpack("iid", aug)
        return state[:-4], ["MT19937", int.from_bytes(state[-4:], sys.byteorder, signed=True), has_gauss, gauss]


def _memory(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size)


def _drawn(inst: Any, kind: str) -> Any:
    """``inst`` after each of several draws (a Gaussian cached, taken, the twister's words moved, a reseed)."""
    draws = ([lambda: inst.random(), lambda: inst.gauss(0, 1), lambda: inst.getrandbits(20000), lambda: inst.seed(3)]
             if kind == "random" else
             [inst.standard_normal, inst.standard_normal, lambda: inst.random_sample(700), inst.standard_normal,
              lambda: inst.seed(3)])
    yield inst
    for draw in draws:
        draw()
        yield inst


def _gauss_offset(numpy: Any) -> int:
    """The offset of {int has_gauss; int (padding); double gauss} in a RandomState object: the one where the memory
    follows get_state()'s cache through draws that fill it, take it and fill it again; -1 if there is not one."""
    inst = numpy.random.RandomState(11)
    size = type(inst).__basicsize__
    found = set(range(_HEAD, size - 15, 4))
    for draw in (lambda: None, inst.standard_normal, inst.standard_normal, inst.standard_normal,
                 inst.standard_normal, inst.standard_normal):
        draw()
        _, _, _, has_gauss, gauss = inst.get_state()
        memory = ctypes.string_at(id(inst), size)
        found = {o for o in found if struct.unpack_from("iid", memory, o)[::2] == (has_gauss, gauss)}
    return found.pop() if len(found) == 1 else -1
