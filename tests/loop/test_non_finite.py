"""A diverging run stops with exit 1 and never checkpoints non-finite state."""
import os

from tests.support.cli import run_python, run_trainer, train_ok


def test_divergence_stops_and_checkpoints_stay_finite(tmp_path):
  train_ok(tmp_path, "--config=synthetic", "--config.train.steps=20",
           "--config.checkpoint.interval=10", "--config.train.steps_per_loop=10")
  result = run_trainer(tmp_path, "--config=synthetic", "--config.train.steps=100",
                       "--config.checkpoint.interval=10", "--config.train.steps_per_loop=10",
                       "--config.train.learning_rate=1e9")
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  error = [line for line in result.error_lines() if line.startswith("distloop: error:")]
  assert len(error) == 1 and "non-finite" in error[0] and "steps 21..30" in error[0]
  assert "the last checkpoint is step 20" in error[0]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["10", "20"]
  code = ("import numpy as np, orbax.checkpoint as ocp, jax\n"
          "for step in (10, 20):\n"
          "  for item in ('model', 'optimizer'):\n"
          f"    tree = ocp.PyTreeCheckpointer().restore(f'{tmp_path}/checkpoints/{{step}}/{{item}}')\n"
          "    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]\n"
          "    assert all(np.isfinite(x).all() for x in leaves if x.dtype.kind == 'f'), (step, item)\n"
          "print('finite')\n")
  assert run_python(code).strip() == "finite"
