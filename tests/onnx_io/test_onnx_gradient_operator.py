"""The two tests of ai.onnx.preview.training's Gradient operator that ONNX ships
(test_gradient_of_add, test_gradient_of_add_and_mul), through gc.grad, on the reference
interpreter and the compiled CPU target, against the expected outputs stored with them.

Their models declare opset 12 of the default domain; the importer takes opsets 13 and
later, so they are converted with onnx.version_converter first (Add and Mul are the same
in opsets 12 and 13).
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import onnx.backend.test
import onnx.version_converter
import pytest
from onnx import numpy_helper

from gradcompiler.onnx.backend import backend_for

from oracle import assert_close

DATA = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "simple")


def _tensors(case: str, kind: str) -> list[np.ndarray]:
    paths = sorted(glob.glob(os.path.join(DATA, case, "test_data_set_0", f"{kind}_*.pb")))
    return [numpy_helper.to_array(onnx.load_tensor(p)) for p in paths]


@pytest.mark.parametrize("target", ["reference", "cpu"])
@pytest.mark.parametrize("case", ["test_gradient_of_add", "test_gradient_of_add_and_mul"])
def test_gradient_operator(case, target):
    model = onnx.load(os.path.join(DATA, case, "model.onnx"))
    model = onnx.version_converter.convert_version(model, 13)
    got = backend_for(target).prepare(model).run(_tensors(case, "input"))
    want = _tensors(case, "output")
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-6)
