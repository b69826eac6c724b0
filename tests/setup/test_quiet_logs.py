"""One log policy: by default a run's stderr holds distloop's own lines only -- no orbax,
JAX or TensorFlow INFO chatter, no TensorFlow C++ start-up lines -- also when stderr is a
log file, not a terminal (issue 33). The Python API and Ray: tests/setup/test_python_api.py and
tests/cluster/test_ray.py count orbax's lines there."""
import pathlib
import re

from tests.support.cli import REPO, run_trainer

# An absl line: severity, date, time, thread, file:line]
_ABSL = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ ([\w.]+\.py):\d+\] ")
_OWN_FILES = {path.name for folder in ("trainer", "input_pipelines", "models", "configs")
              for path in (pathlib.Path(REPO) / folder).rglob("*.py")}


def test_a_run_logs_only_distloops_lines_to_a_log_file(tmp_path):
  result = run_trainer(tmp_path / "run", "--config=synthetic", "--config.train.steps=4",
                       "--config.train.steps_per_loop=2", "--config.checkpoint.interval=2")
  assert result.returncode == 0, result.stderr[-3000:]
  foreign = []
  for line in result.stderr.splitlines():
    if not line.strip() or line.startswith("  "):  # the summary's indented lines
      continue
    match = _ABSL.match(line)
    if match is None or match.group(1) not in _OWN_FILES:
      foreign.append(line)
  assert not foreign, foreign[:10]
  assert "Training mnist_cnn on synthetic" in result.stderr  # distloop's lines do show
