"""The inventory as text: one table of nodes × GPUs with the pods holding each, the totals,
then the pending GPU pods and the conflicts.

A GPU in MIG mode has a line for each of its MIG devices below it (`└`, the profile, its
memory, health and holders). A GPU shared through DRA shows the memory its claims' shares
hold of it (`24/80 GiB`); a holder of a DRA claim reads as any other (`wide` says `dra`).
It fits `width` columns (80 by default): long names are cut with `…`, several holders and
long reasons wrap onto further lines. `wide` adds UUIDs,
container names and paths and cuts nothing. Colour (ANSI) only when asked for; the CLI asks
on a terminal without `NO_COLOR`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator

from gpuwire.holders import ANNOTATION, Holder
from gpuwire.records import PLUGIN_LESS
from inventory.view import Gpu, Inventory, Mig, Node

GAP = "  "
RED, YELLOW, BOLD, DIM, RESET = "\x1b[31m", "\x1b[33m", "\x1b[1m", "\x1b[2m", "\x1b[0m"
PLUGIN_LESS_MARK = "*"
CONFLICT_MARK = "!"
MIN_LAST = 16  # the last column (holders, reasons) gets at least this much
_BRANDS = ("NVIDIA ", "Tesla ")

Cell = tuple[str, str]  # text, style ("" for none)
Paint = Callable[[str, str], str]


def render(
    inventory: Inventory, *, width: int = 80, wide: bool = False, color: bool = False
) -> str:
    def paint(style: str, text: str) -> str:
        return f"{style}{text}{RESET}" if color and style and text else text

    lines = _gpu_table(inventory, width, wide, paint)
    if inventory.pending:
        lines += ["", *_pending_table(inventory, width, wide, paint)]
    if inventory.conflicts:
        lines += ["", paint(BOLD, "CONFLICTS")]
        for node, conflict in inventory.conflicts:
            text = f"{CONFLICT_MARK} {node.name}: {conflict.explain(node.gpu_names())}"
            lines += [paint(RED, line) for line in _wrap(text, width, wide, "  ")]
    marked = not wide and any(h.path == PLUGIN_LESS for n in inventory.nodes for h in _holders(n))
    if marked:
        legend = (
            f"{PLUGIN_LESS_MARK} plugin-less: GPUs granted by annotation, not by a device plugin"
        )
        lines += ["", *_wrap(legend, width, wide, "  ")]
    return "\n".join(lines) + "\n"


def _holders(node: Node) -> Iterator[Holder]:
    return (h for g in node.gpus for _, _, d in _rows(g) for h in d.holders)


def _rows(gpu: Gpu) -> list[tuple[str, str, Gpu | Mig]]:
    """(GPU column, product column, what the rest is about) for a GPU and its MIG devices."""
    rows: list[tuple[str, str, Gpu | Mig]] = [(str(gpu.index), product(gpu.product), gpu)]
    rows += [("└", f"MIG {m.profile}", m) for m in gpu.mig or ()]
    return rows


def _cut(text: str, size: int) -> str:
    return text if len(text) <= size else text[: max(size - 1, 0)] + "…"


def _wrap(text: str, width: int, wide: bool, indent: str = "") -> list[str]:
    if wide:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def product(name: str) -> str:
    """`NVIDIA A100-SXM4-80GB` → `A100-SXM4-80GB`: the brand says nothing in a GPU table."""
    for brand in _BRANDS:
        if name.startswith(brand) and len(name) > len(brand):
            return name[len(brand) :]
    return name


def memory(mib: int) -> str:
    return f"{round(mib / 1024)} GiB" if mib else "?"


def memory_cell(device: Gpu | Mig) -> str:
    """The memory; a shared DRA GPU's as what its shares hold of it: `24/80 GiB`."""
    used = device.shared_mib if isinstance(device, Gpu) else None
    if used is None:
        return memory(device.memory_mib)
    return f"{round(used / 1024)}/{memory(device.memory_mib)}"


def holder_text(holder: Holder, wide: bool) -> str:
    if wide:
        who = "/".join(p for p in (holder.namespace, holder.pod, holder.container) if p)
        return f"{who} ({holder.path}{', all' if holder.whole_node else ''})"
    return holder.name + (PLUGIN_LESS_MARK if holder.path == PLUGIN_LESS else "")


def _pack(items: list[str], size: int) -> list[str]:
    """`items` joined with `, ` into lines of at most `size` characters (each item cut to fit)."""
    lines: list[str] = []
    for item in (_cut(i, size) for i in items):
        if lines and len(lines[-1]) + 2 + len(item) <= size:
            lines[-1] += ", " + item
        else:
            if lines:
                lines[-1] += ","
            lines.append(item)
    return lines


def _join(cells: list[Cell], widths: list[int], paint: Paint) -> str:
    """One line: each cell padded to its width (the last one not), painted after padding."""
    parts = []
    for i, (text, style) in enumerate(cells):
        padded = text if i == len(cells) - 1 else text.ljust(widths[i])
        parts.append(paint(style, padded) if text else padded)
    return GAP.join(parts).rstrip()


def _gpu_table(inventory: Inventory, width: int, wide: bool, paint: Paint) -> list[str]:
    nodes = inventory.nodes
    if not nodes:
        return [_summary(inventory) + " (no node lists GPUs or advertises a GPU resource)"]
    rows = [row for n in nodes for g in n.gpus for row in _rows(g)]
    heads = ["NODE", "GPU", *(["UUID"] if wide else []), "PRODUCT", "MEMORY", "HEALTH", "HOLDERS"]
    fixed = [
        max([4, *(len(n.name) for n in nodes)]),
        3,
        *([max([4, *(len(d.uuid) for _, _, d in rows)])] if wide else []),
        max([7, *(len(name) for _, name, _ in rows)]),
        max([6, *(len(memory_cell(d)) for _, _, d in rows)]),
        6,
    ]
    if not wide:
        fixed[0] = min(fixed[0], 14)
        fixed[2] = min(fixed[2], 16)
    last = max(MIN_LAST, width - sum(fixed) - len(GAP) * len(fixed))
    widths = [*fixed, last]
    lines = [_join([(h, BOLD) for h in heads], widths, paint)]
    for node in nodes:
        first = True
        for index, name, device in (row for g in node.gpus for row in _rows(g)):
            for i, (text, style) in enumerate(_holder_lines(device, last, wide)):
                cells: list[Cell] = [(_cut(node.name, widths[0]) if first else "", "")]
                first = False
                if i == 0:
                    health = ("ok", "") if device.healthy else ("FAIL", RED)
                    cells += [(index.rjust(3), "")]
                    cells += [(device.uuid, "")] if wide else []
                    cells += [(_cut(name, widths[-4]), ""), (memory_cell(device), "")]
                    cells += [health]
                else:
                    cells += [("", "")] * (len(widths) - 2)
                lines.append(_join([*cells, (text, style)], widths, paint))
        if not node.gpus:
            lines.append(_join([(_cut(node.name, widths[0]), "")], widths, paint))
        indent = " " * (widths[0] + len(GAP))
        lines += [indent + line for line in _wrap(_node_summary(node), width - len(indent), wide)]
    lines.append(_summary(inventory))
    return lines


def _holder_lines(gpu: Gpu | Mig, size: int, wide: bool) -> list[Cell]:
    if not gpu.holders:
        return [("-", DIM)]
    names = [holder_text(h, wide) for h in gpu.holders]
    style = RED if gpu.conflicted else ""
    mark = f" {CONFLICT_MARK}" if gpu.conflicted else ""
    lines = names if wide else _pack(names, size - len(mark))
    lines[-1] += mark
    return [(line, style) for line in lines]


def _node_summary(node: Node) -> str:
    words = [f"{node.allocated}/{node.total} allocated"]
    if not node.gpus:
        words = [f"{node.total} GPU(s) advertised; no gpuwire agent reports them"]
    elif not node.holders_known:
        words.append(f"holders unknown (no {ANNOTATION} annotation)")
    if not node.ready:
        words.append("NotReady")
    if not node.schedulable:
        words.append("SchedulingDisabled")
    words += node.problems
    return ", ".join(words)


def _summary(inventory: Inventory) -> str:
    nodes = inventory.gpu_nodes
    text = f"cluster: {inventory.allocated}/{inventory.total} GPUs allocated on {nodes} node"
    text += "s" if nodes != 1 else ""
    if inventory.pending:
        count = len(inventory.pending)
        text += f", {count} pending GPU pod{'s' if count != 1 else ''}"
    if inventory.conflicts:
        count = len(inventory.conflicts)
        text += f", {count} conflict{'s' if count != 1 else ''}"
    return text


def _pending_table(inventory: Inventory, width: int, wide: bool, paint: Paint) -> list[str]:
    pods = [f"{p.namespace}/{p.pod}" for p in inventory.pending]
    fixed = [max([11, *map(len, pods)]), max([7, *(len(p.request) for p in inventory.pending)])]
    if not wide:
        fixed = [min(fixed[0], 28), min(fixed[1], 20)]
    last = max(MIN_LAST, width - sum(fixed) - len(GAP) * len(fixed))
    widths = [*fixed, last]
    lines = [_join([("PENDING POD", BOLD), ("REQUEST", BOLD), ("WHY", BOLD)], widths, paint)]
    for name, pod in zip(pods, inventory.pending, strict=True):
        why = f"{pod.reason}: {pod.message}" if pod.message else pod.reason
        why = f"on {pod.node}: {why}" if pod.node else why
        for i, line in enumerate(_wrap(why, last, wide)):
            cells: list[Cell] = (
                [(_cut(name, fixed[0]), ""), (_cut(pod.request, fixed[1]), "")]
                if i == 0
                else [("", ""), ("", "")]
            )
            lines.append(_join([*cells, (line, YELLOW)], widths, paint))
    return lines
