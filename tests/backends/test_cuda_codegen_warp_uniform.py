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
barrier sits under a branch on a thread-dependent value or in a loop whose trip
count depends on one, nor a shuffle, unless the branch is `t < 32·k` (whole warps).
Thread-dependent: `cuda.threadIdx.*`, `cuda.grid`, `cuda.laneid` and every name
computed from them (`t`, `tx`, `ty`, `lane`, a grid-stride index...).
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


def _reads_thread_index(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` reads `cuda.threadIdx.*`, `cuda.grid(...)`, `cuda.laneid` or a name
    derived from them."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in names:
            return True
        if isinstance(n, ast.Attribute) and n.attr in ("threadIdx", "laneid", "grid"):
            return True
    return False


def _own_nodes(scope: ast.AST):
    """The nodes of a function (or module) body, not those of the functions defined in it:
    each kernel has its own `t`, and a helper's `out` is not the kernel's."""
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def _bound_names(target: ast.AST) -> set[str]:
    """The names an assignment binds (`a`, `a, b`), not an array it writes into (`s0[t] = ...`)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for element in target.elts for name in _bound_names(element)}
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return set()


def _thread_names(scope: ast.AST) -> set[str]:
    """Every name of `scope` whose value depends on the thread: `t`, `tx`, `ty`, a lane, a
    grid-stride index, and whatever is computed from those (followed to a fixed point)."""
    names: set[str] = set()
    while True:
        found = set(names)
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, ast.For):
                targets, value = [node.target], node.iter
            else:
                continue
            if _reads_thread_index(value, found):
                found |= {name for target in targets for name in _bound_names(target)}
        if found == names:
            return names
        names = found


def _whole_warps(test: ast.AST, names: set[str]) -> bool:
    """`t < 32·k` on the block's x index: true or false for all 32 lanes of a warp at once, so
    a shuffle under it is reached by every lane of the warps that enter."""
    return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Lt)
            and isinstance(test.left, ast.Name) and test.left.id in names
            and isinstance(test.comparators[0], ast.Constant)
            and isinstance(test.comparators[0].value, int) and test.comparators[0].value % 32 == 0)


def _violations(source: str) -> list[str]:
    tree = ast.parse(source)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, functions))]
    return sorted((v for scope in scopes for v in _scope_violations(scope)),
                  key=lambda v: int(v.split(":")[0].removeprefix("line ")))


def _scope_violations(scope: ast.AST) -> list[str]:
    found = []
    names = _thread_names(scope)
    for node in _own_nodes(scope):
        for child in ast.iter_child_nodes(node):
            if _is_shuffle(child) and not (isinstance(node, ast.Assign) and node.value is child):
                found.append(f"line {child.lineno}: a shuffle inside an expression ({ast.unparse(node)[:80]})")
        # a branch, or a loop whose trip count, depends on the thread
        divergent = ((isinstance(node, (ast.If, ast.While))
                      and _reads_thread_index(node.test, names))
                     or (isinstance(node, ast.For) and _reads_thread_index(node.iter, names)))
        if divergent:
            header = ast.unparse(node.test if not isinstance(node, ast.For) else node.iter)
            uniform = isinstance(node, ast.If) and _whole_warps(node.test, names)
            for inner in ast.walk(ast.Module(body=node.body + node.orelse, type_ignores=[])):
                if _is_barrier(inner):
                    found.append(f"line {inner.lineno}: a barrier under `{header}`")
                if _is_shuffle(inner) and not uniform:
                    found.append(f"line {inner.lineno}: a shuffle under `{header}`")
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


@pytest.mark.parametrize("condition", ["ty > 0", "row < m", "tx % 2 == 0", "t < 16"])
def test_the_check_catches_a_shuffle_under_a_condition_on_any_thread_index(condition):
    """`tx`, `ty` and names computed from them count as much as `t`: a shuffle under such a
    condition leaves lanes of a warp out. Only whole warps (`t < 32`) may skip one."""
    kernel = ("def kernel(p0, m):\n"
              "    t = cuda.threadIdx.x\n"
              "    tx = cuda.threadIdx.x\n"
              "    ty = cuda.threadIdx.y\n"
              "    row = cuda.blockIdx.y * 8 + ty\n"
              "    w0 = p0[t]\n"
              f"    if {condition}:\n"
              "        o0 = cuda.shfl_down_sync(0xFFFFFFFF, w0, 16)\n"
              "    if t < 32:\n"
              "        o1 = cuda.shfl_down_sync(0xFFFFFFFF, w0, 16)\n")
    assert _violations(kernel) == [f"line 8: a shuffle under `{condition}`"]
