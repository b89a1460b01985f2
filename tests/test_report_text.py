"""The text of a compiled step's report: every section, with the figures the
compiler exposes, and kernel costs checked against hand-derived formulas."""

from __future__ import annotations

import re

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.report import SECTIONS, format_report, fused_ops
from gradcompiler.units import format_bytes, format_count

from helpers import mlp_step


@pytest.fixture(scope="module")
def step():
    return gc.compile(mlp_step((12, 6, 5, 3), first=gc.tanh, dtype="float32").outputs, target="cpu")


@pytest.fixture(scope="module")
def sections(step) -> dict[str, list[str]]:
    """Section title → its lines, parsed from the report text."""
    found: dict[str, list[str]] = {}
    current = None
    for line in format_report(step).splitlines():
        title = re.fullmatch(r"== (\w+) ==", line)
        if title:
            current = title.group(1)
            found[current] = []
        elif current is not None and line:
            found[current].append(line)
    return found


def row_of(lines: list[str], first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is `first_cell`."""
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n" + "\n".join(lines))


def test_report_has_every_section_in_order(step, sections):
    assert list(sections) == list(SECTIONS)
    assert all(sections[title] for title in SECTIONS)
    head = format_report(step).splitlines()[0]
    assert f"{len(step.graph)} after" in head and "7 outputs" in head


def test_step_report_is_format_report_with_every_section(step):
    text = step.report()

    def steady(report: str) -> list[str]:
        """The report less its cache-counter line, which counts the on-disk cache's files as
        they are when each report is made (another process may be compiling into it)."""
        return [line for line in report.splitlines() if "cache counters of this process" not in line]

    assert steady(text) == steady(format_report(step))
    for title in SECTIONS:
        assert f"\n== {title} ==\n" in text
    info = gc.cache_info()
    counters = next(line for line in text.splitlines() if "cache counters of this process" in line)
    assert f"directory={info['directory']}" in counters
    assert all(f"{key}=" in counters for key in info)


def test_loop_rows_name_their_module_and_how_they_run(step, sections):
    for kernel in step.kernels:
        cells = row_of(sections["kernels"], kernel.name)
        if kernel.kind == "loop":
            assert kernel.module in cells and step.source().count(f"# ---- {kernel.module}\n") == 1
            assert cells[5].endswith(", parallel" if kernel.parallel else ", serial")
        else:
            assert cells[5] == "library"


def test_passes_section_lists_every_pass_with_its_node_counts(step, sections):
    lines = sections["passes"]
    for stats, line in zip(step.context.stats, lines):
        assert line.split()[0] == stats.name
        assert f"{stats.nodes_before} → {stats.nodes_after}" in re.sub(r"\s+", " ", line)
    assert any("fuse" == line.split()[0] for line in lines)


def test_kernel_rows_match_hand_derived_matmul_costs(step, sections):
    lines = sections["kernels"]
    for kernel in step.kernels:
        row_of(lines, kernel.name)
    # The first step is the first layer x(8,12) @ w1(12,6): 2·8·6·12 = 1152 FLOPs; it reads
    # 8·12 + 12·6 floats and writes 8·6, 4·(96 + 72 + 48) = 864 bytes.
    first = step.kernels[0]
    assert first.ops == ["MatrixMul"]
    assert row_of(lines, first.name)[1:5] == ["library", "8×6", "864 B", "1.15 k"]
    total = row_of(lines, "total")
    assert total[1] == format_bytes(sum(k.bytes_moved for k in step.kernels))


def test_kernel_rows_show_the_fused_ops(step, sections):
    fused = max((k for k in step.kernels if k.kind == "loop"), key=lambda k: len(k.ops))
    assert len(fused.ops) > 2, "the softmax part of the loss should fuse into one loop"
    assert row_of(sections["kernels"], fused.name)[-1] == fused_ops(fused.ops)
    distinct = len({k.module for k in step.kernels if k.kind == "loop"})
    assert f"({distinct} distinct kernels)" in sections["kernels"][0]


def test_captures_section_lists_each_capture_with_its_size(step, sections):
    memory = step.context.memory
    assert memory.captures, "the tanh and relu layers keep values for the backward"
    lines = sections["captures"]
    total = 0
    for node_id, _shape, _dtype, _nbytes in memory.captures:
        node = step.graph[node_id]
        size = int(np.prod(node.type.shape)) * node.type.dtype.itemsize
        total += size
        cells = row_of(lines, f"%{node_id}")
        assert cells[-1] == format_bytes(size) and node.op.label in cells
    assert lines[0].strip().startswith(f"{len(memory.captures)} forward values")
    assert format_bytes(total) in lines[0]


def test_memory_section_compares_peak_with_the_unfused_peak(step, sections):
    memory = step.context.memory
    first = sections["memory"][0]
    assert f"peak {format_bytes(memory.peak_bytes)}," in first
    assert f"unfused op-by-op peak {format_bytes(memory.unfused_peak_bytes)}" in first
    saved = 100 * (memory.unfused_peak_bytes - memory.peak_bytes) / memory.unfused_peak_bytes
    assert f"({saved:.0f}% less)" in first
    # the returned values, summed from the graph's outputs by hand: a floor no plan goes below
    graph = step.graph
    returned = sum(int(np.prod(graph[n].type.shape)) * graph[n].type.dtype.itemsize
                   for n in set(graph.outputs) if n in memory.lifetimes)
    assert sections["memory"][1].strip().startswith(f"returned values {format_bytes(returned)}:")
    assert memory.peak_bytes >= returned


def test_compile_section_shows_stage_times_and_cache_hits(step, sections):
    lines = sections["compile"]
    for stage in step.timings:
        assert f"{stage} " in lines[0]
    distinct = {k.module: k for k in step.kernels if k.kind == "loop"}
    hits = sum(k.from_cache for k in distinct.values())
    assert f"cache: {hits} of {len(distinct)} distinct kernels" in lines[1]


def test_a_forward_only_step_reports_no_captures():
    with gc.Graph("fwd"):
        out = gc.exp(gc.input("x", (3, 2))).sum(axis=1)
    text = format_report(gc.compile(out))
    captures = text.split("== captures ==")[1].split("==")[0].strip().splitlines()
    assert captures == ["0 forward values kept for the backward, 0 B in all"]


@pytest.mark.parametrize("nbytes, text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                          (3 * 2**20, "3.0 MiB"), (5 * 2**40, "5.0 TiB")])
def test_format_bytes(nbytes, text):
    assert format_bytes(nbytes) == text


@pytest.mark.parametrize("count, text", [(0, "0"), (999, "999"), (1152, "1.15 k"),
                                         (2_500_000, "2.5 M"), (3e9, "3 G")])
def test_format_count(count, text):
    assert format_count(count) == text


def test_fused_ops_counts_repeats_in_first_seen_order():
    assert fused_ops(["ADD", "TANH", "ADD", "MUL"]) == "ADD ×2, TANH, MUL"
