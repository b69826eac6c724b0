"""Actions (train.actions): user code at loop boundaries by its rule, seeing the metrics,
whose "save"/"stop" decisions are agreed by every worker; bad ones refused in one line."""
import json
import os
import re

import pytest

from tests.support.cli import REPO, run_trainer, train_ok

_PLUGINS = os.path.join(REPO, "tests", "plugins", "action_plugins.py")
_EXAMPLE = os.path.join(REPO, "examples", "actions.py")
_FLAGS = ["--config=synthetic", "--config.train.steps=60", "--config.train.steps_per_loop=25",
          "--config.checkpoint.interval=50", "--config.data.num_train_examples=512",
          "--config.data.num_eval_examples=200"]


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_an_action_every_7_steps_cuts_the_loops_there_and_sees_the_metrics(tmp_path):
  train_ok(tmp_path, *_FLAGS, f"--config.train.actions={_PLUGINS}:record_every_7",
           "--config.eval.interval=0")
  seen = _lines(tmp_path / "every_7.jsonl")
  assert [row["step"] for row in seen] == [7, 14, 21, 28, 35, 42, 49, 56]  # not 25, 50
  assert all(row["loss"] > 0 for row in seen)


@pytest.mark.slow  # a whole training run or two: the fast suite's time (CI runs it)
def test_save_decision_checkpoints_that_step(tmp_path):
  train_ok(tmp_path, *_FLAGS, f"--config.train.actions={_PLUGINS}:save_at_30")
  assert sorted(os.listdir(tmp_path / "checkpoints"), key=int) == ["30", "50", "60"]


def test_stop_decision_ends_training_there_with_checkpoint_eval_and_export(tmp_path):
  summary = train_ok(tmp_path, *_FLAGS, f"--config.train.actions={_PLUGINS}:stop_at_40")
  assert summary["step"] == 40 and summary["stopped_early_by"] == "stop_at_40"
  assert summary["eval_examples"] == 200
  assert "40" in os.listdir(tmp_path / "checkpoints")
  assert os.path.isdir(tmp_path / "export" / "40")


def _early_stop_config(tmp_path, *lines: str) -> str:
  """A config file: synthetic, early_stop's patience 1 and min_delta 10 (so it stops at
  the second eval), and `lines` of the user's own."""
  config = tmp_path / "config.py"
  config.write_text("\n".join([
      "from configs import synthetic", "def get_config():",
      "  config = synthetic.get_config()", "  config.unlock()",
      "  config.early_stop = dict(patience=1, min_delta=10.0)",
      *(f"  {line}" for line in lines), "  return config", ""]))
  return str(config)


def test_csv_log_and_early_stop_example(tmp_path):
  """examples/actions.py: an eval every 10 steps, stop once eval loss stops improving
  by 10 (so, at the second eval), a CSV of every metric."""
  config = _early_stop_config(
      tmp_path, f"config.train.actions = '{_EXAMPLE}:csv_log,{_EXAMPLE}:early_stop'",
      "config.train.steps, config.eval.interval, config.train.steps_per_loop = 60, 10, 10",
      "config.data.num_train_examples, config.data.num_eval_examples = 512, 200")
  summary = train_ok(tmp_path / "run", f"--config={config}", "--mode=train_and_eval")
  assert summary["step"] == 20 and summary["stopped_early_by"] == "early_stop"
  rows = (tmp_path / "run" / "my_metrics.csv").read_text().splitlines()
  assert rows[0] == "step,split,name,value"
  assert any(row.startswith("10,eval,loss,") for row in rows)
  assert any(row.startswith("20,train,accuracy,") for row in rows)


def test_an_action_never_due_is_refused_in_one_line_before_training(tmp_path):
  result = run_trainer(tmp_path / "run", *_FLAGS, f"--config.train.actions={_PLUGINS}:never_due")
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1 and "is never due" in lines[0], lines
  assert not (tmp_path / "run").exists()


def test_an_action_deciding_nonsense_stops_the_run_with_one_error_line(tmp_path):
  result = run_trainer(tmp_path / "run", *_FLAGS,
                       f"--config.train.actions={_PLUGINS}:returns_a_number")
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.splitlines()[-1] == (
      "distloop: error: action 'returns_a_number' returned 3; an action returns None, 'stop', "
      "trainer.Stop(reason) or 'save'")
  assert "Traceback" not in result.stderr


_MULTI = ["--config=synthetic", "--config.train.steps=60", "--config.train.global_batch_size=48",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=50",
          "--config.data.num_train_examples=1000", "--config.data.num_eval_examples=500",
          "--config.runtime.strategy=multi_worker_mirrored"]


def _two_workers(model_dir, *flags, exit_code=0):
  from tests.support.processes import TrainerProcess, loopback_only  # pylint: disable=g-import-not-at-top
  config = [f for f in flags if f.startswith("--config=")] or ["--config=synthetic"]
  rest = [f for f in flags if not f.startswith("--config=")]
  job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={model_dir}", *config,
                       *_MULTI[1:], *rest,
                       module="trainer.launch", prefix=loopback_only())
  try:
    assert job.wait(timeout=240) == exit_code, job.output[-3000:]
  finally:
    job.kill()
  return job.output


@pytest.mark.slow
@pytest.mark.parametrize("decider", ["stop_on_worker_1_at_40", "early_stop",
                                     "checkpoint.early_stop_patience"])
def test_two_workers_stop_together_where_one_decides(tmp_path, decider):
  """Only worker 1 decides (or both, from the same eval): the decision is agreed, every
  worker stops at step 40, exit 0, with the final checkpoint, eval and export."""
  from tests.support.processes import loopback_unavailable  # pylint: disable=g-import-not-at-top
  if loopback_unavailable():
    pytest.skip(loopback_unavailable())
  if decider == "checkpoint.early_stop_patience":  # the built-in: loss within 10 is no gain
    flags = ["--config.checkpoint.early_stop_patience=1", "--config.checkpoint.best_metric=loss",
             "--config.checkpoint.best_mode=min", "--config.checkpoint.early_stop_min_delta=10",
             "--config.eval.interval=20", "--mode=train_and_eval"]
  elif decider == "early_stop":
    flags = [f"--config={_early_stop_config(tmp_path)}",
             f"--config.train.actions={_EXAMPLE}:early_stop",
             "--config.eval.interval=20", "--mode=train_and_eval"]
  else:
    flags = [f"--config.train.actions={_PLUGINS}:{decider}"]
  output = _two_workers(tmp_path / "run", *flags)
  for worker in ("worker-0", "worker-1"):
    assert re.search(rf"\[{worker}\].*decided to stop at step 40", output), output[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["step"] == 40 and summary["num_replicas"] == 2
  assert "40" in os.listdir(tmp_path / "run" / "checkpoints")
  assert os.path.isdir(tmp_path / "run" / "export" / "40")


def _quick_config(steps=10, **fields):
  """synthetic, `steps` steps in loops of 2, a small eval split; `fields`: checkpoint.X."""
  import configs  # pylint: disable=g-import-not-at-top
  config = configs.get("synthetic")
  config.unlock()
  config.train.steps, config.train.steps_per_loop = steps, 2
  config.data.num_train_examples, config.data.num_eval_examples = 256, 64
  for name, value in fields.items():
    setattr(config.checkpoint, name, value)
  return config


def _recording_at_end(seen: list):
  import trainer  # pylint: disable=g-import-not-at-top
  return trainer.Action(
      lambda boundary: seen.append((boundary.step, boundary.final, boundary.eval is not None)),
      at_end=True, name="at_end_recorder")


@pytest.mark.parametrize("ending", [pytest.param("last step", marks=pytest.mark.slow),
                                    "an action's stop", "early stopping"])
def test_at_end_actions_run_on_every_normal_finish(tmp_path, ending):
  """"stop" finishes as at the last step: the at_end actions run there, once, after the
  final eval (which they see), whoever stopped the run."""
  import trainer  # pylint: disable=g-import-not-at-top
  seen, mode, actions = [], "train", []
  config = _quick_config()
  if ending == "an action's stop":
    actions = [trainer.Action(lambda boundary: "stop" if boundary.step == 4 else None,
                              every_steps=2, name="stop_at_4")]
  elif ending == "early stopping":  # eval every 2 steps; a loss within 10 is no gain: stops at 4
    config = _quick_config(early_stop_patience=1, best_metric="loss", best_mode="min",
                           early_stop_min_delta=10.0)
    config.eval.interval, mode = 2, "train_and_eval"
  summary = trainer.run(config, str(tmp_path), mode=mode,
                        actions=[*actions, _recording_at_end(seen)])
  step = 10 if ending == "last step" else 4
  assert summary["step"] == step
  assert seen == [(step, True, True)]


@pytest.mark.parametrize("phase", ["restored", "eval", *[pytest.param(phase, marks=pytest.mark.slow)
                                                         for phase in ("export", "summary")]])
def test_a_decision_at_a_phase_is_refused_in_one_line_naming_it(tmp_path, phase):
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserCodeError  # pylint: disable=g-import-not-at-top
  deciding = trainer.Action(lambda boundary: "stop", phase=phase, name="stops_at_a_phase")
  with pytest.raises(UserCodeError) as raised:
    trainer.run(_quick_config(steps=2), str(tmp_path), actions=[deciding])
  message = str(raised.value)
  assert message.startswith(f"action 'stops_at_a_phase' (phase={phase!r}) returned 'stop' at "
                            f"step "), message
  assert "which a phase cannot honour" in message and "\n" not in message


def test_an_api_action_that_is_not_an_action_is_one_line(tmp_path):
  """trainer.run(actions=[a function]): one UserError naming what it got, no checkpoint.
  Catches: the list taken unchecked (an AttributeError traceback from deep in the loop)."""
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError, match=r"^trainer.run\(actions=...\) holds a function, not a "
                                      r"trainer.Action$"):
    trainer.run(_quick_config(steps=2), str(tmp_path), actions=[lambda boundary: None])
  assert not (tmp_path / "checkpoints").exists()


_AT_BOUNDARIES = ["--config=synthetic", "--config.train.steps=40",
                  "--config.train.steps_per_loop=10", "--config.checkpoint.interval=10",
                  "--config.model.conv_filters=8", "--config.model.dense_units=16",
                  "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]


def _resumes_from_20_and_finishes(model_dir, *flags):
  again = run_trainer(model_dir, *_AT_BOUNDARIES, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  assert re.search(r"from step 20 to 40", again.stderr), again.stderr[-3000:]
  assert json.loads((model_dir / "summary.json").read_text())["step"] == 40


@pytest.mark.parametrize("code", ["0", "3"])
def test_an_action_calling_sys_exit_fails_the_run_in_one_line_with_its_step_saved(tmp_path,
                                                                                  code):
  """Issue 43: sys.exit(0) in an Action at step 20 of 40 ended the run with exit 0 ("done")
  and no line, no summary.json, steps 11-20 lost; sys.exit(3) exited 3 silently. Now: step
  20 saved, one line naming the action and the step, exit 1; the same command resumes."""
  model_dir = tmp_path / "run"
  flags = [f"--config.train.actions={_PLUGINS}:exits_at_20"]
  result = run_trainer(model_dir, *_AT_BOUNDARIES, *flags,
                       env={"DISTLOOP_TEST_EXIT_CODE": code})
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  lines = [line for line in result.error_lines() if "distloop: error" in line]
  assert len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith(f"distloop: error: action 'exits_at_20' called sys.exit({code}) "
                             f"at step 20 (action_plugins.py:"), lines[0]
  assert "an Action cannot end the run" in lines[0] and "step 20 is saved" in lines[0], lines[0]
  assert "20" in os.listdir(model_dir / "checkpoints")
  assert not (model_dir / "summary.json").exists()
  _resumes_from_20_and_finishes(model_dir, *flags)


def test_an_action_raising_keyboard_interrupt_stops_the_run_as_sigint_does(tmp_path):
  """Issue 43: an Action raising KeyboardInterrupt gave a traceback and exit 130 with step
  20 unsaved; a real SIGINT saves it and exits 42. Now the same as SIGINT."""
  model_dir = tmp_path / "run"
  flags = [f"--config.train.actions={_PLUGINS}:interrupts_at_20"]
  result = run_trainer(model_dir, *_AT_BOUNDARIES, *flags)
  assert result.returncode == 42, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "preempted at step 20; its checkpoint is on disk" in result.stderr, result.stderr[-3000:]
  assert "action 'interrupts_at_20' raised KeyboardInterrupt at step 20" in result.stderr
  assert "20" in os.listdir(model_dir / "checkpoints")
  _resumes_from_20_and_finishes(model_dir, *flags)


def test_the_stop_line_names_who_decided_in_plain_words():
  """Issue 43 (low): a worker that did not decide logged "action an action on another
  worker decided to stop" (the name pasted after "action")."""
  from trainer.loop import actions  # pylint: disable=g-import-not-at-top
  assert actions.stop_line("stop_at_40", 40) == (
      "action stop_at_40 decided to stop at step 40: saved; finishing as at the last step")
  assert actions.stop_line(None, 40) == (
      "an action on another worker decided to stop at step 40: saved; finishing as at the "
      "last step")


@pytest.mark.slow
def test_two_workers_stop_at_the_step_where_an_action_on_one_raises_keyboard_interrupt(
    tmp_path):
  """The interrupt is agreed after the boundary's actions, as a signal there is: every
  worker stops at step 20 with it saved (not at the next boundary), the job exits 42."""
  from tests.support.processes import loopback_unavailable  # pylint: disable=g-import-not-at-top
  if loopback_unavailable():
    pytest.skip(loopback_unavailable())
  output = _two_workers(tmp_path / "run", f"--config.train.actions={_PLUGINS}:"
                        f"interrupts_on_worker_1_at_20", exit_code=42)
  for worker in ("worker-0", "worker-1"):
    assert re.search(rf"\[{worker}\].*preempted at step 20; its checkpoint is on disk",
                     output), output[-3000:]
  assert "20" in os.listdir(tmp_path / "run" / "checkpoints")
