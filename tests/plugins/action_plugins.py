"""Actions for tests/loop/test_actions.py: each FUNCTION(config) -> trainer.Action(s)."""
import json
import os
import sys

import trainer


def _append(boundary, name, value):
  path = os.path.join(boundary.model_dir, f"{name}.jsonl")
  with open(path, "a") as f:
    f.write(json.dumps(value) + "\n")


def record_every_7(config):
  """Writes (step, train loss, eval seen) at every multiple of 7, from the chief."""
  del config

  def record(boundary):
    if boundary.is_chief:
      _append(boundary, "every_7", {"step": boundary.step, "loss": boundary.train["loss"],
                                    "eval": boundary.eval is not None})
  return trainer.Action(record, every_steps=7, name="record_every_7")


def save_at_30(config):
  del config
  return trainer.Action(lambda boundary: "save" if boundary.step == 30 else None,
                        every_steps=10, name="save_at_30")


def stop_at_40(config):
  del config
  return trainer.Action(lambda boundary: "stop" if boundary.step == 40 else None,
                        every_steps=10, name="stop_at_40")


def stop_on_worker_1_at_40(config):
  """Only the second worker decides: the agreement makes every worker stop there."""
  del config
  task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
  decides = task.get("type") == "worker" and task.get("index") == 1

  def maybe_stop(boundary):
    return "stop" if decides and boundary.step == 40 else None
  return trainer.Action(maybe_stop, every_steps=10, name="stop_on_worker_1_at_40")


def returns_a_number(config):
  del config
  return trainer.Action(lambda boundary: 3, every_steps=10, name="returns_a_number")


def never_due(config):
  del config
  return trainer.Action(lambda boundary: None, name="never_due")


def raises_at_20(config):
  del config

  def fail(boundary):
    if boundary.step == 20:
      raise ValueError(f"no room for step {boundary.step}")
  return trainer.Action(fail, every_steps=10, name="raises_at_20")


def raises_in_phase(config):
  """Raises in the phase named by the environment's DISTLOOP_TEST_PHASE."""
  del config

  def fail(boundary):
    raise RuntimeError("phase work failed")
  return trainer.Action(fail, phase=os.environ["DISTLOOP_TEST_PHASE"], name="raises_in_phase")


def exits_at_20(config):
  """sys.exit(DISTLOOP_TEST_EXIT_CODE) at step 20 ("none": a bare sys.exit()), as a user's
  "I am done" might: the run must not end behind distloop's back (exit 0, nothing saved)."""
  del config
  code = os.environ.get("DISTLOOP_TEST_EXIT_CODE", "0")

  def leave(boundary):
    if boundary.step == 20:
      sys.exit(None if code == "none" else int(code))
  return trainer.Action(leave, every_steps=10, name="exits_at_20")


def interrupts_at_20(config):
  """Raises KeyboardInterrupt at step 20: the run stops as on SIGINT (step 20 saved, exit 42)."""
  del config

  def interrupt(boundary):
    if boundary.step == 20:
      raise KeyboardInterrupt
  return trainer.Action(interrupt, every_steps=10, name="interrupts_at_20")


def interrupts_on_worker_1_at_20(config):
  """KeyboardInterrupt on the second worker only: every worker stops at step 20, saved."""
  del config
  task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
  interrupts = task.get("type") == "worker" and task.get("index") == 1

  def maybe_interrupt(boundary):
    if interrupts and boundary.step == 20:
      raise KeyboardInterrupt
  return trainer.Action(maybe_interrupt, every_steps=10, name="interrupts_on_worker_1_at_20")
