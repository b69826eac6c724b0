"""The task: what one step does (the Task contract), and the built-in supervised Task.

`contract.py` the contract a user implements; `contexts.py` what distloop hands a
Task (the reduction, loss scaling and stateless randomness live there);
`supervised.py` the built-in step, written on the same contract; `state.py` /
`keys.py` what a built Task holds, its checkpoint keys and the check of its traced steps
against them (`stateful_ops.py`: which traced ops keep state, shared with the preprocess).

Around them, what a step is made of: optimizers (the one place gradients become
an update) and loss scaling, losses, metrics, heads (a multi-output model's loss,
weight and metrics per output) and probabilities, the data's
preprocess, plug-in resolution (plugins.py), a task's own failures as one line
(user_code.py), the model checks (compatibility.py), the start-up checks of a
config (validation.py, no TensorFlow), which of a Task's own config fields may change
on resume (run_fields.py) and the one list of built-in names
(names.py).

The contract's names are imported on first use, so that the start-up checks
(validation.py, plugins.py) run before TensorFlow loads.
"""
_CONTRACT = {"Task": "trainer.task.contract", "Export": "trainer.task.contract",
             "BuildContext": "trainer.task.contexts", "StepContext": "trainer.task.contexts"}


def __getattr__(name):
  if name in _CONTRACT:
    import importlib  # pylint: disable=g-import-not-at-top
    return getattr(importlib.import_module(_CONTRACT[name]), name)
  raise AttributeError(f"module 'trainer.task' has no attribute {name!r}")


def create(config, task=None):
  """The run's Task (a trainer.Task): `task` (a Task instance or class, or a function
  of the config returning one), else train.task (MODULE:FUNCTION, the same), else the
  built-in supervised step."""
  from trainer.task.contract import Task  # pylint: disable=g-import-not-at-top
  from trainer.task import plugins  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  spec = task if task is not None else config.train.task
  if spec in (None, ""):
    from trainer.task import supervised  # pylint: disable=g-import-not-at-top
    return supervised.SupervisedTask()
  field = "train.task"
  shown = spec if isinstance(spec, str) else repr(spec)
  made = plugins.resolve(field, spec) if isinstance(spec, str) else spec
  if not isinstance(made, Task):  # a Task class, or a function of the config
    made = (plugins.call(field, shown, made) if isinstance(made, type)
            else plugins.call(field, shown, made, config))
  if not isinstance(made, Task):
    raise UserError(f"{field}={shown!r} gave {type(made).__name__}, not a trainer.Task")
  return made
