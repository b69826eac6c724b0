"""What the loop is assembled from, before the flow begins: the run's Task."""
from trainer.errors import UserError
from trainer.setup import plugins
from trainer.task.contract import Task


def create_task(config, task=None):
  """The run's Task (a trainer.Task): `task` (a Task instance or class, or a function
  of the config returning one), else train.task (MODULE:FUNCTION, the same), else the
  built-in supervised step."""
  spec = task if task is not None else config.train.task
  if spec in (None, ""):
    from trainer.supervised.task import SupervisedTask  # pylint: disable=g-import-not-at-top
    return SupervisedTask()
  field = "train.task"
  shown = spec if isinstance(spec, str) else repr(spec)
  made = plugins.resolve(field, spec) if isinstance(spec, str) else spec
  if not isinstance(made, Task):  # a Task class, or a function of the config
    made = (plugins.call(field, shown, made) if isinstance(made, type)
            else plugins.call(field, shown, made, config))
  if not isinstance(made, Task):
    raise UserError(f"{field}={shown!r} gave {type(made).__name__}, not a trainer.Task")
  return made
