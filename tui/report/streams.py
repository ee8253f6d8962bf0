"""The report's streams: every collective record's (process group, op, dtype, size), named as
the live view names them (:mod:`tui.model.streams`: a group by its name and description from
the ranks' Hellos, never by a rank's code), as one small integer code per record.

``stream_codes`` gives each record a code whose order is that of (group, op, dtype, size); a
code's *combo* packs them (:func:`combo_parts` unpacks it). Columnar: a recording of one group,
op and size (the synthetic loop) costs a few comparisons per column, several streams one
comparison per stream, many streams one sort.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tui.model.streams import Group, dtype_name, group_label, group_order, op_name, rank_groups
from workers.wire import protocol as p
from workers.wire.busbw import bus_factors

#: Records per block for the passes that build per-record codes.
BLOCK = 1 << 20
_NBYTES_MASK = (1 << 40) - 1


@dataclass(frozen=True)
class GroupNames:
    """The run's groups (by global index: name, description, size) and each record's global
    group index."""

    groups: tuple[Group, ...]
    index: np.ndarray  # uint8 per record
    single: bool = False  # every record is of one group

    def label(self, g: int) -> str:
        name, desc, _ = self.groups[g]
        return group_label(name, desc)


def group_names(
    rank: np.ndarray,
    group: np.ndarray,
    hellos: Sequence[tuple[int, p.Hello]],
    world: int,
    ranks_seen: Sequence[int] | None = None,
) -> GroupNames:
    """Name every record's group from its rank's Hellos (the longest table a rank sent: groups
    are only ever added). A rank without a Hello names code 0 the world group "0"; a code its
    rank never named is group "?CODE". ``ranks_seen``: the ranks with records, when known."""
    tables: dict[int, tuple[Group, ...]] = {}
    for _, h in hellos:
        table = rank_groups(h)
        if len(table) >= len(tables.get(h.rank, ())):
            tables[h.rank] = table
    n = len(rank)
    top = int(group.max()) if n else 0
    if ranks_seen is None:
        ranks_seen = np.flatnonzero(np.bincount(rank)).tolist() if n else []
    ranks = sorted({*tables, *ranks_seen})
    seen: dict[str, Group] = {}
    for r in ranks:
        table = tables.get(r) or (("0", "", world),)
        for g in table:
            seen.setdefault(g[0], g)
        for code in range(len(table), min(top, 255) + 1):
            seen.setdefault(f"?{code}", (f"?{code}", "", 0))
    groups = tuple(seen[k] for k in sorted(seen, key=group_order))
    index_of = {g[0]: i for i, g in enumerate(groups)}
    width = min(top, 255) + 1
    lut = np.zeros((max(ranks, default=0) + 1, width), dtype=np.uint8)
    for r in ranks:
        table = tables.get(r) or (("0", "", world),)
        lut[r] = [index_of[table[c][0] if c < len(table) else f"?{c}"] for c in range(width)]
    if n == 0:
        return GroupNames(groups, np.zeros(0, dtype=np.uint8), True)
    if top == 0 and bool((lut[:, 0] == lut[0, 0]).all()):  # one group: the usual case
        return GroupNames(groups, np.full(n, lut[0, 0], dtype=np.uint8), True)
    out = np.empty(n, dtype=np.uint8)
    same = bool((lut == lut[0]).all())  # every rank numbers its groups alike
    for a in range(0, n, BLOCK):
        codes = np.minimum(group[a : a + BLOCK], width - 1)
        out[a : a + BLOCK] = lut[0][codes] if same else lut[rank[a : a + BLOCK], codes]
    return GroupNames(groups, out, int(np.count_nonzero(np.bincount(out))) == 1)


def pack(g: int, op: int, dtype: int, nbytes: int) -> int:
    """A stream's combo: ``group << 56 | op << 48 | dtype << 40 | nbytes`` (sizes below 1 TiB)."""
    return g << 56 | op << 48 | dtype << 40 | (nbytes & _NBYTES_MASK)


def combo_parts(combo: int) -> tuple[int, int, int, int]:
    """(global group, op, dtype, nbytes) of a combo."""
    return combo >> 56, (combo >> 48) & 0xFF, (combo >> 40) & 0xFF, combo & _NBYTES_MASK


def stream_codes(
    gindex: np.ndarray, op: np.ndarray, dtype: np.ndarray, nbytes: np.ndarray
) -> tuple[np.ndarray, list[int]]:
    """A small code per record for its stream, and each code's combo; codes ascend with the
    combos (group, op, dtype, size)."""
    n = len(op)
    if n == 0:
        return np.zeros(0, dtype=np.uint8), []
    step = max(1, n // 4096)
    cols = (gindex, op, dtype, nbytes)
    firsts = [int(c[0]) for c in cols]
    if all(len(np.unique(c[::step])) == 1 for c in cols) and all(
        bool((c == v).all()) for c, v in zip(cols, firsts, strict=True)
    ):
        return np.zeros(n, dtype=np.uint8), [pack(*firsts)]
    packed = _packed(gindex, op, dtype, nbytes)
    cands = np.unique(packed[::step]).tolist()
    if len(cands) <= 64:
        codes = np.full(n, 255, dtype=np.uint8)
        for a in range(0, n, BLOCK):
            part, out = packed[a : a + BLOCK], codes[a : a + BLOCK]
            for i, c in enumerate(cands):
                out[part == np.uint64(c)] = i
        if not bool((codes == 255).any()):
            return codes, [int(c) for c in cands]
    uniq, inverse = np.unique(packed, return_inverse=True)
    return inverse.astype(np.int32).ravel(), [int(c) for c in uniq.tolist()]


def _packed(gindex: np.ndarray, op: np.ndarray, dtype: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    out = np.empty(len(op), dtype=np.uint64)
    for a in range(0, len(op), BLOCK):
        s = slice(a, a + BLOCK)
        part = np.minimum(nbytes[s], _NBYTES_MASK).astype(np.uint64)
        part |= gindex[s].astype(np.uint64) << np.uint64(56)
        part |= op[s].astype(np.uint64) << np.uint64(48)
        part |= dtype[s].astype(np.uint64) << np.uint64(40)
        out[s] = part
    return out


@dataclass(frozen=True)
class StreamName:
    """What a combo names, in words."""

    group: str
    group_desc: str
    group_size: int
    op: str
    dtype: str
    nbytes: int
    op_code: int = 0

    @property
    def group_text(self) -> str:
        return group_label(self.group, self.group_desc)

    @property
    def bus_factor(self) -> float:
        """nccl-tests' busbw factor over the group's size (0 for a barrier or an unknown size)."""
        return float(bus_factors(np.array([self.op_code]), np.array([self.group_size]))[0])


def stream_name(names: GroupNames, combo: int) -> StreamName:
    g, op, dtype, nbytes = combo_parts(combo)
    name, desc, size = names.groups[g] if g < len(names.groups) else (f"?{g}", "", 0)
    return StreamName(name, desc, size, op_name(op), dtype_name(dtype, nbytes), nbytes, op)
