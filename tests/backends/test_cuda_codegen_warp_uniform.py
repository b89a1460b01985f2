"""Generated CUDA kernels reach every warp-collective call with the whole warp.

A full-mask `cuda.shfl_down_sync` that some lane of the warp does not reach
never completes, and a `cuda.syncthreads()` that some thread of the block
skips never returns: the GPU hangs, with no error. Numba's simulator runs no
shuffles (the tree ends in shared memory there), so the simulator tests
cannot see this; it was seen on an H200, where a MAX reduction placed the
shuffle inside its conditional expression and the softmax kernel of the mlp
step never finished.

Oracle: the structure of the generated source itself, parsed with `ast`, for
kernels of every reduction mode, row and whole-domain layouts, at warp and
multi-warp block sizes with shuffles on (and of the hand-written library
kernels): every shuffle is the whole value of an assignment statement,
never inside a conditional expression, a boolean operator or a call; and no
barrier sits under a branch on the thread index `t` or in a loop whose trip count
depends on it, and no shuffle in such a loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cuda.codegen import block_for, generate
from gradcompiler.kernel import KernelStep

MODES = ("sum", "mean", "max", "min", "prod", "sum_sqr")


def _kernels(mode: str, rows: int, cols: int) -> list:
    """The loop kernels of a graph that reduces each row and the whole array with `mode`."""
    with gc.Graph("warp"):
        x = gc.input("x", (rows, cols))
        reduce = getattr(gc, mode)
        per_row = reduce(gc.exp(x), axis=1)
        whole = reduce(x * 2.0)
        softmax_like = gc.exp(x - gc.max(x, axis=1, keepdims=True)) / per_row.reshape((rows, 1))
    step = gc.compile([per_row, whole, softmax_like], target="cpu")
    return [s.kernel for s in step.program.steps if isinstance(s, KernelStep)]


def _is_shuffle(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "shfl_down_sync"


def _is_barrier(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "syncthreads"


def _branches_on_thread(test: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "t" for n in ast.walk(test))


def _violations(source: str) -> list[str]:
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if _is_shuffle(child) and not (isinstance(node, ast.Assign) and node.value is child):
                found.append(f"line {child.lineno}: a shuffle inside an expression ({ast.unparse(node)[:80]})")
        # a branch, or a loop whose trip count, depends on the thread index
        divergent = ((isinstance(node, (ast.If, ast.While)) and _branches_on_thread(node.test))
                     or (isinstance(node, ast.For) and _branches_on_thread(node.iter)))
        if divergent:
            header = ast.unparse(node.test if not isinstance(node, ast.For) else node.iter)
            for inner in ast.walk(ast.Module(body=node.body + node.orelse, type_ignores=[])):
                if _is_barrier(inner):
                    found.append(f"line {inner.lineno}: a barrier under `{header}`")
                if _is_shuffle(inner) and not isinstance(node, ast.If):
                    found.append(f"line {inner.lineno}: a shuffle in a loop over `{header}`")
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows, cols", [(4, 10), (3, 100), (2, 700)])
def test_every_shuffle_and_barrier_is_reached_by_the_whole_warp(mode, rows, cols):
    kernels = _kernels(mode, rows, cols)
    shuffles = 0
    for kernel in kernels:
        for limit in (32, 256):
            source = generate(kernel, block_for(kernel, limit), True).source
            assert not _violations(source), source
            shuffles += source.count("shfl_down_sync")
    assert shuffles, "no kernel finished a tree with shuffles: the test checked nothing"


@pytest.mark.parametrize("module", sorted(p.name for p in Path(gc.__file__).parent.glob("backends/numba_cuda/*.py")))
def test_hand_written_kernels_follow_the_same_rule(module):
    source = (Path(gc.__file__).parent / "backends" / "numba_cuda" / module).read_text()
    assert not _violations(source)


def test_the_check_catches_a_shuffle_inside_a_conditional_expression():
    """The failure this file guards against, written by hand: the check must flag it."""
    hanging = ("def kernel(p0):\n"
               "    t = cuda.threadIdx.x\n"
               "    w0 = p0[t]\n"
               "    w0 = w0 if w0 >= cuda.shfl_down_sync(0xFFFFFFFF, w0, 16) else "
               "cuda.shfl_down_sync(0xFFFFFFFF, w0, 16)\n"
               "    if t < 16:\n"
               "        cuda.syncthreads()\n")
    found = _violations(hanging)
    assert sorted(f.split(": ")[1].split(" ")[1] for f in found) == ["barrier", "shuffle", "shuffle"], found
