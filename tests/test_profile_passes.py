"""GRADCOMPILER_PROFILE_PASSES=1: a compile over the threshold names its slowest pass."""

import importlib
import re

import gradcompiler as gc
from gradcompiler.bench import workloads

compile_module = importlib.import_module("gradcompiler.compile")  # `gc.compile` is the function


def _compile(monkeypatch, flag: str | None, threshold: float):
    if flag is None:
        monkeypatch.delenv("GRADCOMPILER_PROFILE_PASSES", raising=False)
    else:
        monkeypatch.setenv("GRADCOMPILER_PROFILE_PASSES", flag)
    monkeypatch.setattr(compile_module, "PROFILE_THRESHOLD_S", threshold)
    w = workloads.build("bcast_reduce", "tiny")
    return gc.compile(w.outputs)


def test_a_slow_compile_names_its_slowest_pass(monkeypatch, capsys):
    step = _compile(monkeypatch, "1", 0.0)
    line = capsys.readouterr().err.strip()
    found = re.fullmatch(r"gradcompiler: compile took [\d.]+ s; slowest pass: (\w+) "
                         r"\(([\d.]+) s, work (\d+)\); "
                         r"passes [\d.]+ s, lowering [\d.]+ s, codegen\+numba [\d.]+ s", line)
    assert found, line
    seconds = {}
    for s in step.context.stats:
        seconds[s.name] = seconds.get(s.name, 0.0) + s.seconds
    assert found.group(1) == max(seconds, key=seconds.get)
    assert int(found.group(3)) == step.context.work.total() > 0


def test_a_fast_compile_or_no_flag_prints_nothing(monkeypatch, capsys):
    _compile(monkeypatch, "1", 1e9)
    _compile(monkeypatch, None, 0.0)
    _compile(monkeypatch, "0", 0.0)
    assert capsys.readouterr().err == ""
