"""The task: what one step does (the Task contract), and the built-in supervised Task.

`contract.py` the contract a user implements; `contexts.py` what distloop hands a
Task (the reduction, loss scaling and stateless randomness live there);
`supervised.py` the built-in step, written on the same contract; `state.py` /
`keys.py` what a built Task holds and its checkpoint keys.
"""
from trainer.task.contexts import BuildContext
from trainer.task.contexts import StepContext
from trainer.task.contract import Export
from trainer.task.contract import Task


def create(config, task=None) -> Task:
  """The run's Task: `task` (a Task instance or class, or a function of the config
  returning one), else train.task (MODULE:FUNCTION, the same), else the built-in
  supervised step."""
  from trainer import plugins  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  spec = task if task is not None else config.train.task
  if spec in (None, ""):
    from trainer.task import supervised  # pylint: disable=g-import-not-at-top
    return supervised.SupervisedTask()
  where = f"train.task={spec!r}" if isinstance(spec, str) else f"task {spec!r}"
  made = plugins.resolve("train.task", spec) if isinstance(spec, str) else spec
  if isinstance(made, Task):
    return made
  try:
    made = made() if isinstance(made, type) else made(config)
  except UserError:
    raise
  except SystemExit as e:
    raise UserError(f"{where} called sys.exit({e.code})") from None
  except Exception as e:  # pylint: disable=broad-except  (a user's code raises anything)
    raise UserError(f"{where} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    ) from None
  if not isinstance(made, Task):
    raise UserError(f"{where} gave {type(made).__name__}, not a trainer.Task")
  return made
