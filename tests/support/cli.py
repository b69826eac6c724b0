"""Run the trainer as a user does: `python -m trainer ...` in a subprocess."""
import dataclasses
import json
import os
import subprocess
import sys

from tests.support.processes import dies_with_its_test

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
MNIST_TEST_DIR = os.path.join(REPO, "tests", "data", "mnist")  # real MNIST test files (1.7 MB)


@dataclasses.dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str

  def error_lines(self) -> list[str]:
    return [line for line in self.stderr.splitlines() if line.strip()]


def user_environment() -> dict:
  """os.environ as a user's shell has it: importing TensorFlow in this test process set
  TF_CPP_MIN_LOG_LEVEL=1, which a child would inherit instead of the trainer's default."""
  return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def run_trainer(model_dir, *flags: str, timeout: float = 600, env: dict | None = None) -> Result:
  command = [*dies_with_its_test(), sys.executable, "-m", "trainer", f"--model_dir={model_dir}",
             *flags]
  try:
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                               cwd=REPO, env={**user_environment(), **(env or {})})
  except subprocess.TimeoutExpired as e:  # say where it was, not only that it hung
    output = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
    raise AssertionError(f"trainer still running after {timeout} s; its log ends:\n"
                         f"{(output or '')[-3000:]}") from None
  return Result(completed.returncode, completed.stdout, completed.stderr)


def train_ok(model_dir, *flags: str, timeout: float = 600) -> dict:
  """Trains to the end and returns summary.json; fails the test with the log otherwise."""
  result = run_trainer(model_dir, *flags, timeout=timeout)
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
  with open(os.path.join(model_dir, "summary.json")) as f:
    return json.load(f)


def run_python(code: str, timeout: float = 300) -> str:
  """Runs `code` in a fresh interpreter (e.g. to prove distloop is not needed); returns stdout."""
  completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout, cwd="/", env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert completed.returncode == 0, completed.stderr[-4000:]
  return completed.stdout
