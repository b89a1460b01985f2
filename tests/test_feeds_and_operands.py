"""One feed dict serves every output of a graph; unknown feed names and non-numeric
operands are clear errors."""

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import FeedError


def test_feeds_of_the_graph_that_an_output_does_not_read_are_ignored():
    with gc.Graph("g"):
        x = gc.input("x", (2,), "float64")
        labels = gc.input("labels", (2,), "int32")
        doubled = x * 2
    feeds = {"x": np.array([1.0, -3.0]), "labels": np.array([0, 1], np.int32)}
    np.testing.assert_array_equal(gc.evaluate(doubled, feeds), [2.0, -6.0])
    assert labels.shape == (2,)
    with pytest.raises(FeedError, match=r"unexpected feed\(s\) \['lables'\]"):
        gc.evaluate(doubled, {"x": feeds["x"], "lables": feeds["labels"]})


def test_a_non_numeric_operand_names_the_users_line():
    with gc.Graph("g"):
        x = gc.input("x", (2,))
        line = __import__("inspect").currentframe().f_lineno + 2
        with pytest.raises(gc.DTypeError, match=r"cannot use a str \('abc'\) as a tensor operand") as err:
            x + "abc"
    assert f"{__file__}:{line}" in str(err.value)
    assert isinstance(err.value, TypeError)
