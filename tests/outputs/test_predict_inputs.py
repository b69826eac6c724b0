"""The digest of a chunk's input rows (trainer/loop/predict.py `input_digest`): what a
rerun compares to see that the data changed since a chunk was scored."""
import numpy as np
import pytest

from input_pipelines import sources
from trainer.loop.predict import input_digest


def _source(**changed):
  """Five examples, features a dict (floats and fixed-size strings) and int labels."""
  features = {"a": np.arange(10, dtype=np.float32).reshape(5, 2),
              "s": np.array([b"x", b"yy", b"z", b"", b"w"])}
  labels = np.arange(5)
  for name, (row, value) in changed.items():
    (labels if name == "label" else features[name])[row] = value
  return sources.as_source((features, labels), where="five")


def test_the_digest_does_not_depend_on_the_batch_size():
  """Read 1, 2, 3 or 5 rows at a time: one digest (a rerun may use another
  predict.global_batch_size)."""
  source = _source()
  assert len({input_digest(source, batch)(0, 5) for batch in (1, 2, 3, 5)}) == 1
  assert input_digest(source, 2)(0, 3) == input_digest(source, 3)(0, 3)


@pytest.mark.parametrize("name, row, value", [("a", 4, 0.5), ("s", 1, b"yz"), ("label", 0, 7)])
def test_one_value_of_one_row_changes_the_digest_of_its_rows_only(name, row, value):
  before, after = input_digest(_source(), 2), input_digest(_source(**{name: (row, value)}), 2)
  assert before(0, 5) != after(0, 5)
  assert before(row, row + 1) != after(row, row + 1)
  others = (0, row) if row else (1, 5)
  assert before(*others) == after(*others)
