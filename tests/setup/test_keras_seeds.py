"""Keras's default seeds come from the config, not from Python's global `random`
(trainer/cluster/runtime.py keras_seeds_from, issue 57): a bucket client's retry, a
tracker or a tuner drawing from the global generator between the seeding and the
model's build must not change a deterministic run's weights. The slow bucket test
(tests/buckets/test_bucket_model_dir.py::test_retried_faults_change_no_weight) shows it
end to end; this one fails at once if a Keras upgrade moves where it draws its seeds."""
import random

import keras
import numpy as np

from trainer.cluster import runtime


def _kernel(*, draws_between: int, from_the_config: bool) -> np.ndarray:
  keras.utils.set_random_seed(7)
  for _ in range(draws_between):
    random.random()  # another library's draw, after seed() and before the build
  if from_the_config:
    with runtime.keras_seeds_from(7):
      layer = keras.layers.Dense(3)
  else:
    layer = keras.layers.Dense(3)
  layer.build((None, 4))
  return np.asarray(layer.kernel)


def test_a_draw_from_the_global_random_before_the_build_changes_no_weight():
  untouched = _kernel(draws_between=0, from_the_config=True)
  np.testing.assert_array_equal(_kernel(draws_between=3, from_the_config=True), untouched)
  # The seeds are the ones the seeded global generator gives: a run on disk keeps its weights.
  np.testing.assert_array_equal(_kernel(draws_between=0, from_the_config=False), untouched)


def test_without_it_the_same_draw_changes_the_weights():
  """What the test above would miss if Keras stopped drawing from the generator the
  hook replaces: the draw must matter without the hook."""
  assert not np.array_equal(_kernel(draws_between=3, from_the_config=False),
                            _kernel(draws_between=0, from_the_config=False))


def test_after_the_build_the_global_random_goes_on_as_if_undisturbed():
  keras.utils.set_random_seed(7)
  with runtime.keras_seeds_from(7):
    keras.layers.Dense(3).build((None, 4))
  with_hook = random.random()
  keras.utils.set_random_seed(7)
  keras.layers.Dense(3).build((None, 4))
  assert random.random() == with_hook
