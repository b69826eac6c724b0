"""A full disk or a read-only file system while writing a checkpoint, config.json,
summary.json, the export or TensorBoard's events: one line naming what, where and the
space it needed, exit 1 (42 when it was the preemption save, the last complete
checkpoint intact; 2 for a model_dir read-only from the start, bad input), no
traceback. Each case mounts a small tmpfs (root can write through chmod, not through
a full or read-only file system) on the part of model_dir it breaks."""
import json
import os
import re
import shutil
import signal
import subprocess
import uuid

import pytest

from tests.support.cli import REPO, run_trainer
from tests.support.processes import TrainerProcess, checkpoint_arrays

_FLAGS = ["--config=synthetic", "--config.train.steps=60", "--config.train.global_batch_size=48",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=20",
          "--config.data.num_train_examples=1000", "--config.data.num_eval_examples=500"]
_CHECKPOINT_MB = 4.2  # the default CNN with Adam: weights and two slots, float32


def _mount_refusal() -> str | None:
  """Why a tmpfs cannot be mounted here, or None."""
  if os.geteuid() != 0 or not shutil.which("mount"):
    return "mounting a small tmpfs needs root and mount(8)"
  probe = f"/tmp/distloop-mount-probe-{uuid.uuid4().hex}"
  os.makedirs(probe)
  try:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", probe],
                          capture_output=True, text=True)
    if done.returncode:
      return f"mount -t tmpfs is not permitted here ({done.stderr.strip()})"
    subprocess.run(["umount", probe], check=True)
    return None
  finally:
    os.rmdir(probe)


_REFUSAL = _mount_refusal()
pytestmark = [pytest.mark.skipif(_REFUSAL is not None, reason=str(_REFUSAL)),
              pytest.mark.slow]  # python -m pytest -m slow (CI runs these too)


@pytest.fixture
def tmpfs():
  """mount(path, size, read_only=False): a tmpfs at `path`, unmounted afterwards."""
  mounted = []

  def mount(path, size: str, read_only: bool = False):
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    mounted.append(str(path))
    return path
  yield mount
  for path in reversed(mounted):
    subprocess.run(["umount", "-l", path], check=False)


def _one_line(result_stderr: str, code: int, returncode: int) -> str:
  assert returncode == code, result_stderr[-3000:]
  assert "Traceback" not in result_stderr, result_stderr[-5000:]
  errors = [line for line in result_stderr.splitlines() if line.startswith("distloop: error:")]
  assert len(errors) == 1, result_stderr[-3000:]
  return errors[0]


def _temporaries(directory) -> list[str]:
  return [name for name in os.listdir(directory) if "tmp" in name]


def test_disk_full_during_a_checkpoint_save(tmp_path, tmpfs):
  checkpoints = tmpfs(tmp_path / "checkpoints", "1m")
  result = run_trainer(tmp_path, *_FLAGS)
  line = _one_line(result.stderr, 1, result.returncode)
  assert re.search(rf"cannot write the checkpoint of step 20 to {re.escape(str(checkpoints))}: "
                   r"No space left on device \(needs about 4\.\d MB; [\d.]+ [kM]B free there\)",
                   line), line
  assert not os.listdir(checkpoints)  # the unfinished step was removed, nothing committed


def test_disk_full_during_the_preemption_save_exits_42_with_the_last_checkpoint(tmp_path,
                                                                                tmpfs):
  checkpoints = tmpfs(tmp_path / "checkpoints", "6m")  # room for one checkpoint, not two
  process = TrainerProcess(tmp_path, *_FLAGS)
  try:
    process.wait_for(r"checkpoint at step 20 started")
    process.wait_for(r"step 25/")
    process.send(signal.SIGTERM)
    code = process.wait()
  finally:
    process.kill()
  line = next(line for line in process.lines if "preempted at step" in line)
  assert code == 42 and "Traceback" not in process.output, process.output[-5000:]
  assert re.search(r"preempted at step (2[5-9]|3\d), but its checkpoint could not be written "
                   r"\(cannot write the checkpoint of step \1 .*No space left on device.*\); "
                   r"the last complete checkpoint is step 20", line), line
  assert os.listdir(checkpoints) == ["20"]
  assert checkpoint_arrays(tmp_path, 20)["model/mnist_cnn/conv/kernel"].shape == (3, 3, 1, 32)


def test_read_only_model_dir(tmp_path, tmpfs):
  """Bad input (exit 2), as every model_dir that cannot be written at start-up
  (tests/setup/test_start_up_writable.py)."""
  model_dir = tmpfs(tmp_path / "run", "1m", read_only=True)
  result = run_trainer(model_dir, *_FLAGS)
  line = _one_line(result.stderr, 2, result.returncode)
  assert f"cannot write the writer lock to {model_dir}/.lock: Read-only file system" in line


def test_disk_full_writing_config_json(tmp_path, tmpfs):
  model_dir = tmpfs(tmp_path / "run", "4k")  # one page: the lock file's
  result = run_trainer(model_dir, *_FLAGS)
  line = _one_line(result.stderr, 1, result.returncode)
  assert re.search(rf"cannot write config.json to {re.escape(str(model_dir))}/config.json: "
                   r"No space left on device \(needs about [\d.]+ kB; 0.0 kB free there\)",
                   line), line
  assert not os.listdir(model_dir)  # no half file, no lock file left


def test_disk_full_during_the_export(tmp_path, tmpfs):
  export = tmpfs(tmp_path / "export", "64k")
  result = run_trainer(tmp_path, *_FLAGS)
  line = _one_line(result.stderr, 1, result.returncode)
  assert re.search(rf"cannot write the SavedModel export to {re.escape(str(export))}/60: "
                   r"No space left on device \(needs about 1\.\d MB; [\d.]+ kB free there\)",
                   line), line
  assert not os.listdir(export)  # the temporary is removed
  assert "60" in os.listdir(tmp_path / "checkpoints")  # the final step is safe


def test_disk_full_writing_summary_json(tmp_path, tmpfs):
  model_dir = tmpfs(tmp_path / "run", "24m")
  hold_file = tmp_path / "go"
  hold = f"--config.train.actions={os.path.join(REPO, 'tests', 'plugins', 'hold_actions.py')}:hold"
  process = TrainerProcess(model_dir, *_FLAGS, hold, env={"DISTLOOP_TEST_HOLD": "summary",
                                                    "DISTLOOP_TEST_HOLD_FILE": str(hold_file)})
  try:
    process.wait_for(r"test hold at summary")
    _fill(model_dir / "filler")
    hold_file.touch()
    code = process.wait()
  finally:
    process.kill()
  line = _one_line(process.output, 1, code)
  assert re.search(rf"cannot write summary.json to {re.escape(str(model_dir))}/summary.json: "
                   r"No space left on device \(needs about [\d.]+ kB; 0.0 kB free there\)",
                   line), line
  assert "60" in os.listdir(model_dir / "checkpoints") and (model_dir / "export" / "60").is_dir()
  assert not _temporaries(model_dir) and not (model_dir / "summary.json").exists()


def _fill(path) -> None:
  """Takes every free byte of the file system holding `path`. Unbuffered: a buffered
  file keeps what did not fit and raises ENOSPC again when it is closed."""
  with open(path, "wb", buffering=0) as f:
    try:
      while True:
        f.write(b"\0" * (1 << 16))  # a partial write takes the last bytes
    except OSError:
      pass


_TINY = ["--config=synthetic", "--config.model.conv_filters=4", "--config.model.dense_units=8",
         "--config.train.steps=10", "--config.train.global_batch_size=16",
         "--config.data.num_train_examples=200", "--config.data.num_eval_examples=100"]


def test_disk_full_writing_the_tensorboard_eval_events(tmp_path, tmpfs):
  """A 700 kB model_dir: a tiny run (and its final eval) fits; filled up, the next eval's
  TensorBoard writer cannot write its first event (a ResourceExhaustedError traceback
  before)."""
  model_dir = tmpfs(tmp_path / "run", "700k")
  result = run_trainer(model_dir, *_TINY, "--mode=train")
  assert result.returncode == 0, result.stderr[-3000:]
  _fill(model_dir / "filler")
  result = run_trainer(model_dir, *_TINY, "--mode=eval")
  line = _one_line(result.stderr, 1, result.returncode)
  assert re.search(rf"cannot write the TensorBoard eval events to "
                   rf"{re.escape(str(model_dir))}/tensorboard/eval: No space left on device "
                   r"\(0\.0 kB free there\)$", line), line


def test_disk_full_writing_the_tensorboard_train_events(tmp_path, tmpfs):
  """The train writer's first event (the config, at start-up) on a full disk."""
  tensorboard = tmpfs(tmp_path / "run" / "tensorboard", "4k")
  _fill(tensorboard / "filler")
  result = run_trainer(tmp_path / "run", *_TINY)
  line = _one_line(result.stderr, 1, result.returncode)
  assert re.search(rf"cannot write the TensorBoard train events to {re.escape(str(tensorboard))}"
                   r"/train: No space left on device \(0\.0 kB free there\)$", line), line


def test_a_full_disk_at_the_tensorboard_close_of_a_failing_run_is_a_warning(tmp_path, tmpfs):
  """The run's close after another error (a failed save, a preemption: exit 42) must not
  put a TensorBoard line (exit 1) in that error's place; a close of its own reports it."""
  from trainer.errors import StorageError  # pylint: disable=g-import-not-at-top
  from trainer.reporters import summaries  # pylint: disable=g-import-not-at-top  (TensorFlow)
  model_dir = tmpfs(tmp_path / "run", "64k")
  closed = []
  for quiet in (True, False):
    run = summaries.Summaries(str(model_dir / str(quiet)), enabled=True)
    for step in range(300):  # the first row is written at once, the rest kept (> a page)
      run.scalars("train", step, {"loss": 1.0 / (step + 1), "accuracy": 0.5})
    closed.append(run)
  _fill(model_dir / "filler")
  closed[0].close(quiet=True)
  with pytest.raises(StorageError, match=rf"cannot write the TensorBoard train events to "
                     rf"{re.escape(str(model_dir))}/False/tensorboard/train: No space left"):
    closed[1].close()


def test_disk_full_writing_predictions_keeps_the_committed_chunks(tmp_path, tmpfs):
  """--mode=predict into a disk that fills after a few chunks: one line naming the chunk,
  its rows and the rows committed, exit 1; what progress.json names is whole, the failed
  chunk's files are gone, and the same command on a disk with room finishes the rest."""
  model_dir = tmp_path / "model"
  result = run_trainer(model_dir, *_FLAGS[:1], "--config.train.steps=5",
                       "--config.data.num_train_examples=500",
                       "--config.data.num_eval_examples=500")
  assert result.returncode == 0, result.stderr[-3000:]
  small = tmpfs(tmp_path / "small", "400k")  # a chunk: ~140 KB (a records shard's 128 KB)
  predict = ["--config.train.steps=5", "--config.data.num_train_examples=500",
             "--config.data.num_eval_examples=500", "--mode=predict",
             "--config.predict.global_batch_size=100", "--config.predict.chunk_rows=100"]
  result = run_trainer(model_dir, *_FLAGS[:1], *predict, f"--config.predict.output={small}")
  line = _one_line(result.stderr, 1, result.returncode)
  match = re.search(rf"cannot write chunk (\d) of the predictions \(rows (\d+)\.\.\d+; rows "
                    rf"0\.\.\d+ are committed\) to {re.escape(str(small))}: No space left on "
                    rf"device", line)
  assert match, line
  committed = int(match.group(1))
  with open(small / "progress.json") as f:
    assert len(json.load(f)["chunks"]) == committed
  assert len(os.listdir(small / "parquet")) == committed
  roomy = tmp_path / "roomy"
  shutil.copytree(small, roomy)
  result = run_trainer(model_dir, *_FLAGS[:1], *predict, f"--config.predict.output={roomy}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])["rows"] == 500
