"""The `gradcompiler` command: `dot`, `bench` and `cache`.

    gradcompiler dot FILE.py [--function build] [--stage forward|backward|optimised] [-o out.svg]
    gradcompiler bench [--target cpu|cuda] [--workload NAME ...] [--json F] [--markdown F]
                       [--plot F] [--quick]
    gradcompiler bench --scaling [--max-depth N] [--max-blocks N] [--json F] [--plot F] [--quick]
    gradcompiler cache info|clear

Each subcommand is a thin shell over a library function (`to_dot`, the
benchmark suite, the kernel cache), so everything the command does can also
be done from Python. A mistake in the user's graph or in the arguments ends
with a one-paragraph message and a non-zero exit status, not a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .backends.numba_cpu.cache import cache_dir, disk_usage
from .bench import suite as bench_suite
from .compile import clear_cache
from .compile import compile as compile_graph
from .dot import STAGES, GraphvizMissingWarning, is_executable, not_drawable, to_dot
from .errors import GradCompilerError
from .units import format_bytes

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A problem the user can fix from the command line; printed without a traceback."""


# -- dot ---------------------------------------------------------------------------------------------

def load_function(path: Path, function: str):
    """The function named `function` in the Python file at `path`, imported by path.

    The module gets a name derived from the file's full path, so two files
    with the same name never shadow each other in `sys.modules`.
    """
    if not path.is_file():
        raise CommandError(f"no such file: {path}")
    digest = hashlib.sha1(str(path.resolve()).encode("utf-8")).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"gradcompiler_user_{digest}", path)
    if spec is None or spec.loader is None:
        raise CommandError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    built = getattr(module, function, None)
    if not callable(built):
        raise CommandError(f"{path} defines no function {function}(); it should build the graph "
                           f"and return its outputs, e.g. [loss, *grads] (or pick another "
                           f"function with --function)")
    return built


def _drawable(result: Any, stage: str, target: str) -> Any:
    """What `to_dot` draws: the built outputs, compiled first for the optimised stage."""
    if stage != "optimised" or is_executable(result):
        return result
    return compile_graph(result, target=target)


def run_dot(args: argparse.Namespace) -> int:
    built = load_function(Path(args.file), args.function)()
    problem = not_drawable(built)
    if problem is not None:
        raise CommandError(f"{args.file}: {args.function}() returned {problem}; it should return "
                           f"the graph's outputs (a Tensor or a list of Tensors, e.g. "
                           f"[loss, *grads]), a Graph or a compiled step")
    drawable = _drawable(built, args.stage, args.target)
    if args.output is None:
        sys.stdout.write(to_dot(drawable, stage=args.stage))
        return EXIT_OK
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphvizMissingWarning)
        try:
            to_dot(drawable, args.output, stage=args.stage)
        except GraphvizMissingWarning as missing:
            print(f"gradcompiler: {missing}", file=sys.stderr)
            return EXIT_FAILED
    print(f"wrote {args.output}")
    return EXIT_OK


# -- cache -------------------------------------------------------------------------------------------

def run_cache(args: argparse.Namespace) -> int:
    """`info`: where the kernel cache lives and what it holds on disk; `clear`: empty it.

    The hit and compile counters of `gc.cache_info()` count what one process did, so a
    process of its own would always show zeros: `info` leaves them out.
    """
    directory = cache_dir()
    if args.action == "clear":
        before = disk_usage(directory)
        clear_cache()
        print(f"removed {before['module_files']} cached modules and their compiled kernels "
              f"from {directory}")
        return EXIT_OK
    usage = disk_usage(directory)
    rows = {"directory": directory, **usage,
            "bytes": f"{usage['bytes']} ({format_bytes(usage['bytes'])})"}
    width = max(len(key) for key in rows)
    for key, value in rows.items():
        print(f"{key:<{width}}  {value}")
    return EXIT_OK


# -- the parser --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradcompiler",
        description="Draw, benchmark and manage the kernels of gradcompiler graphs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dot = commands.add_parser(
        "dot", help="draw a graph at one stage as DOT (or SVG/PNG/PDF with Graphviz)",
        description="Import FILE, call its build function and draw the outputs it returns.")
    dot.add_argument("file", metavar="FILE.py", help="a Python file whose function builds the graph")
    dot.add_argument("--function", default="build",
                     help="the function of FILE that returns the outputs (default: build)")
    dot.add_argument("--stage", choices=STAGES, default="backward",
                     help="forward nodes only, forward and backward, or the compiled graph "
                          "with its fusion groups (default: backward)")
    dot.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                     help="the target compiled for --stage optimised (default: cpu)")
    dot.add_argument("-o", "--output", metavar="OUT",
                     help="write to OUT (.dot, or .svg/.png/.pdf rendered by Graphviz); "
                          "default: print the DOT text")
    dot.set_defaults(run=run_dot)

    bench = commands.add_parser(
        "bench", help="benchmark the compiled workloads against the tools users would pick instead",
        description="Run the benchmark suite of docs/benchmarks.md and write its results.")
    bench_suite.add_arguments(bench)
    bench.set_defaults(run=bench_suite.run_from_args)

    cache = commands.add_parser(
        "cache", help="show or clear the on-disk kernel cache (GRADCOMPILER_CACHE_DIR)",
        description="The generated kernel modules and Numba's compiled code are cached on disk, "
                    "so a second process compiling the same graph does not run Numba again.")
    cache.add_argument("action", choices=("info", "clear"),
                       help="info: the directory, its files and their size; clear: delete them")
    cache.set_defaults(run=run_cache)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gradcompiler` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (CommandError, GradCompilerError, ValueError) as err:
        print(f"gradcompiler {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE if isinstance(err, CommandError) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
