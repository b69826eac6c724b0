"""The Task contract and what a step is handed: the page a step author reads.

`contract.py` the contract a user implements (`Task`, `Export`); `contexts.py` what
distloop hands a Task (`BuildContext` in build(), `StepContext` in train_step(): the one
reduction, loss scaling and stateless randomness live there); `optimizers.py` (the one
place gradients become an update) and `loss_scale.py`; `sparse_gradients.py` (an
Embedding's rows, summed per row); `randomness.py` (Keras's random layers drawn per
example); `user_code.py` (a Task's failures as one line naming it).

What a built Task holds and how it is keyed for checkpoints lives with the checkpoints
(trainer/state/task_state.py, keys.py); the built-in supervised Task, written on this
contract, in trainer/supervised/.

The contract's names are imported on first use, so that importing the package loads no
TensorFlow.
"""
_CONTRACT = {"Task": "trainer.task.contract", "Export": "trainer.task.contract",
             "BuildContext": "trainer.task.contexts", "StepContext": "trainer.task.contexts",
             "PredictContext": "trainer.task.contexts"}


def __getattr__(name):
  if name in _CONTRACT:
    import importlib  # pylint: disable=g-import-not-at-top
    return getattr(importlib.import_module(_CONTRACT[name]), name)
  raise AttributeError(f"module 'trainer.task' has no attribute {name!r}")
