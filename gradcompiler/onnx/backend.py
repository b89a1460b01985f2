"""An `onnx.backend.base.Backend` over gradcompiler, for ONNX's conformance tests
(`onnx.backend.test.BackendTest`): `prepare` imports the model with `from_onnx`, and the
representation it returns runs it through the reference interpreter or a compiled target.

    rep = backend_for("cpu").prepare(model)
    outputs = rep.run([x, y])          # inputs in the model's order, initializers built in

Shapes here are static, so an input whose value sets a shape (a Reshape's target, a
Slice's bounds, Unsqueeze's axes: the conformance tests feed many) is bound at run time:
the model is imported again specialised to that input's value (`from_onnx(values=...)`),
once per distinct value, and compiled for it. That is what a static-shape compiler does
with such a model; the other inputs stay inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx.backend.base import Backend, BackendRep

from ..compile import compile as gc_compile
from ..errors import OnnxValueRequired
from ..reference import evaluate
from .importer import ImportedModel, from_onnx, load_model


class _Specialised:
    """The model imported with some inputs bound to values, and its compiled step."""

    def __init__(self, model, values: dict[str, np.ndarray], target: str) -> None:
        self.imported: ImportedModel = from_onnx(model, values=values)
        self.step = None if target == "reference" else gc_compile(self.imported.outputs, target)

    def run(self, given: dict[str, np.ndarray]) -> list[np.ndarray]:
        feeds = {name: given[name] for name in self.imported.inputs}
        feeds.update(self.imported.param_feeds())
        if self.step is None:
            return evaluate(self.imported.outputs, feeds)
        return self.step(feeds)


class GradCompilerRep(BackendRep):
    """A model bound to a target: the reference interpreter or a compiled one."""

    def __init__(self, model, target: str) -> None:
        self.model = load_model(model)
        self.target = target
        self.names = [i.name for i in self.model.graph.input
                      if i.name not in {init.name for init in self.model.graph.initializer}]
        self.bound: list[str] = []  # inputs whose values the shapes need
        self.versions: dict[bytes, _Specialised] = {}
        self.specialised({})  # import now: a model that cannot import fails in prepare

    def specialised(self, given: dict[str, np.ndarray]) -> _Specialised:
        """The import for the values of the bound inputs, binding more as the importer asks."""
        while True:
            values = {name: np.asarray(given[name]) for name in self.bound}
            key = b"".join(v.tobytes() + str(v.shape).encode() for v in values.values())
            if key in self.versions:
                return self.versions[key]
            try:
                self.versions[key] = _Specialised(self.model, values, self.target)
            except OnnxValueRequired as err:
                if err.input_name not in given:
                    if not given:  # prepare: the values come with the first run
                        return None
                    raise
                self.bound.append(err.input_name)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        values: Sequence[Any] = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        given = dict(zip(self.names, values))
        outputs = self.specialised(given).run(given)
        return tuple(np.asarray(v) for v in outputs)


class GradCompilerBackend(Backend):
    """The backend on the reference interpreter; `backend_for` gives one per target."""

    target = "reference"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> GradCompilerRep:
        super().prepare(model, device, **kwargs)
        return GradCompilerRep(model, cls.target)

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


def backend_for(target: str) -> type[GradCompilerBackend]:
    """A Backend class running on `target` ("reference" or a compile target such as "cpu")."""
    return type(f"GradCompilerBackend_{target}", (GradCompilerBackend,), {"target": target})
