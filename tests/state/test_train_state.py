"""TrainState in one process, without training (trainer/state/train_state.py): what a save
refuses. The end-to-end runs cannot see it: the loop refuses non-finite values before the
save's own guard is reached."""
import numpy as np
import pytest
import tensorflow as tf

import configs
from trainer.cluster.agreement import Agreement
from trainer.errors import NonFiniteError
from trainer.state.train_state import Position, TrainState


def _state(model_dir, weights, iteration):
  config = configs.get("synthetic")
  config.checkpoint.async_save = False
  return TrainState(config, str(model_dir), model_variables={"tiny/kernel": weights},
                    optimizer_variables={"sgd/iteration": iteration},
                    agreement=Agreement(tf.distribute.get_strategy()), is_chief=True,
                    read_only=False)


def test_the_save_itself_refuses_non_finite_state(tmp_path):
  """The last guard, below the loop's own check, for every caller of a save (the periodic
  one, keep-best, the preemption save): a save of NaN weights raises NonFiniteError naming
  the variable and writes no step. Catches: the guard removed, which no end-to-end run
  shows while the loop's check holds."""
  state = _state(tmp_path, tf.Variable(np.array([1.0, np.nan], np.float32)),
                 tf.Variable(3, dtype=tf.int64))
  try:
    with pytest.raises(NonFiniteError, match=r"non-finite values in tiny/kernel at step 3"):
      state.save(Position(3, 96))
    state.wait()
    assert state.all_steps() == []
  finally:
    state.close()
