"""A resume that lands on another shape (issue 44): the same trajectory for every model, or
refused in one line.

The guarantee: under `runtime.deterministic`, what a step computes for an example does not
depend on how many replicas share the batch, so 1, 2 or 3 replicas (or 2 workers) train
the same weights to float32 rounding, and a job preempted on one shape resumes on another
on the same trajectory, saying so in one line. Keras's random layers (Dropout,
RandomFlip, RandomRotation) draw the global batch's numbers and keep each replica's rows
(trainer/task/randomness.py): before, each replica drew over its own share from the same
seed, so replica 1 reused replica 0's numbers and an example's mask changed with the
replica count (the built-in `mlp`, Dropout 0.2: 2.4e-2 apart after 100 steps, 1 vs 2
replicas). What still depends on the replica count (an unsynchronized BatchNormalization,
a Task's tf.random.Generator) is refused on a resume on another replica count (exit 2,
one line, nothing written) unless `checkpoint.allow_other_trajectory` asks to go on, with
one warning line (trainer/state/elastic.py).

The trainings are marked slow and share their runs (module fixtures, two processes at a
time); elastic.judge and the per-example draws are checked in the default suite.
"""
import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support.cli import FASHION_MNIST_DIR, REPO, run_trainer, train_ok, user_environment
from tests.support.processes import TrainerProcess, loopback_only, needs_loopback, read_checkpoint
from trainer.errors import UserError
from trainer.state import elastic
from trainer.analysis import replica_dependence
from trainer.task import randomness

_MIRRORED = "--config.runtime.strategy=mirrored"
_FASHION = ["--config=mnist_cnn", "--config.data.name=fashion_mnist",
            f"--config.data.dir={FASHION_MNIST_DIR}", "--config.train.optimizer=sgd",
            "--config.train.learning_rate=0.1", "--config.runtime.deterministic=true"]
# The built-in mlp (Dropout 0.2): plain SGD moves the weights in proportion to the
# gradient, so a mask that changes with the replica count shows (2.4e-2 before).
_MLP_STEPS = 100
_MLP = [*_FASHION, "--config.model.name=mlp", "--config.train.global_batch_size=96",
        f"--config.train.steps={_MLP_STEPS}", "--config.train.steps_per_loop=5"]
_CNN_STEPS = 30
_CNN = [*_FASHION, "--config.train.global_batch_size=48", f"--config.train.steps={_CNN_STEPS}",
        "--config.train.steps_per_loop=10"]
# Learnable 32x32x3 images (tests/plugins/batchnorm_plugins.py) and a Task with a Generator.
_SYNTHETIC = ["--config=synthetic", "--config.data.num_train_examples=1000",
              "--config.data.num_eval_examples=200", "--config.train.global_batch_size=48",
              "--config.train.steps_per_loop=5", "--config.train.optimizer=sgd",
              "--config.train.learning_rate=0.1", "--config.runtime.deterministic=true",
              _MIRRORED]
_IMAGES = "--config.data.name=tests.plugins.batchnorm_plugins:images"
_ALLOW = "--config.checkpoint.allow_other_trajectory=true"
_HANG = 240  # seconds: far above a healthy two-worker run of the mlp here (~15 s)


def _replicas(count: int) -> list[str]:
  return [_MIRRORED, f"--config.runtime.num_cpu_devices={count}"]


def _steps(count: int) -> str:
  return f"--config.train.steps={count}"


def _in_parallel(*calls):
  """Each call's result, in order; two at a time (this machine's cores)."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    return [future.result() for future in [pool.submit(call) for call in calls]]


def _weights(model_dir, step: int) -> dict:
  return read_checkpoint(model_dir, step, items=("model",))


def _max_difference(actual: dict, expected: dict) -> float:
  assert actual.keys() == expected.keys() and expected
  return max(float(np.max(np.abs(actual[key] - expected[key]))) for key in expected)


def _assert_trained(weights: dict) -> None:
  """Biases start at zero: the runs compared trained (the comparison is not vacuous)."""
  biases = [np.abs(value).max() for key, value in weights.items() if key.endswith("/bias")]
  assert biases and max(biases) > 1e-3, {key: value.shape for key, value in weights.items()}


def _resuming_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if "resuming step" in line]


def _trained_to(model_dir, *flags: str, step: int) -> dict:
  """The model's weights at `step` of a run from scratch (exit 0: its export included)."""
  result = run_trainer(model_dir, *flags)
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  assert re.search(rf"step {step}/{step} ", result.stderr), result.stderr[-3000:]
  return _weights(model_dir, step)


def _snapshot(model_dir) -> dict:
  """Every directory, and every file with its size, modification time and content (not a
  directory's mtime: the writer lock, model_dir/.lock, and the start-up write probes,
  .distloop-probe-*, are created and removed in them before anything is restored)."""
  found = {}
  for root, directories, names in os.walk(model_dir):
    for name in directories:
      found[os.path.relpath(os.path.join(root, name), model_dir)] = "directory"
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
      found[os.path.relpath(path, model_dir)] = (os.stat(path).st_size,
                                                 os.stat(path).st_mtime_ns, digest)
  return found


def _step_meta(model_dir, step: int) -> dict:
  with open(os.path.join(model_dir, "checkpoints", str(step), "meta", "metadata")) as f:
    return json.load(f)


# -- 1, 2: the built-in mlp (Dropout) on Fashion-MNIST ----------------------------------


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
  """{replicas: final weights} of the mlp trained on 1, 2 and 3 replicas."""
  root = tmp_path_factory.mktemp("mlp")

  def train(count):
    summary = train_ok(root / f"replicas{count}", *_MLP, *_replicas(count))
    assert summary["num_replicas"] == count and summary["step"] == _MLP_STEPS
    return _weights(root / f"replicas{count}", _MLP_STEPS)

  one, two = _in_parallel(lambda: train(1), lambda: train(2))
  return {1: one, 2: two, 3: train(3)}


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2, 3])
def test_dropout_trains_the_same_weights_on_any_replica_count(mlp, replicas):
  """Catches: Dropout's mask drawn over each replica's share from one seed (replica 1
  reusing replica 0's numbers): 2.4e-2 apart; now ~1e-7 (each step's sums in another
  order)."""
  _assert_trained(mlp[1])
  difference = _max_difference(mlp[replicas], mlp[1])
  print(f"mlp, 1 vs {replicas} replicas after {_MLP_STEPS} steps: {difference:.3g}")
  assert difference <= 1e-6


@pytest.mark.slow
@needs_loopback
def test_two_preempted_workers_resume_as_one_replica_on_the_same_trajectory(mlp, tmp_path):
  """A 2-worker job (multi_worker_mirrored) SIGTERMed mid-run goes on as one process with
  one replica: the weights of an uninterrupted 1-replica run, and one line saying so.
  Catches: the masks of 2 workers differing from 1 replica's (as in the test above), a
  resume that says nothing of the shape it lands on, or says it twice."""
  job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={tmp_path}", *_MLP,
                       module="trainer.launch", prefix=loopback_only())
  assert job.stop_at(r"\[worker-0\].*step 20/", timeout=_HANG) == 42, job.output[-3000:]
  stopped = {task: int(step) for task, step in
             re.findall(r"\[(worker-\d)\].*preempted at step (\d+)", job.output)}
  assert set(stopped) == {"worker-0", "worker-1"} and len(set(stopped.values())) == 1, (
      stopped, job.output[-4000:])
  step = stopped["worker-0"]
  assert 20 <= step <= _MLP_STEPS - 40, step  # Dropout for 40 steps or more after the resume
  assert _step_meta(tmp_path, step)["shape"] == {"replicas": 2, "workers": 2,
                                                 "strategy": "multi_worker_mirrored"}

  resumed = run_trainer(tmp_path, *_MLP, *_replicas(1))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Restored checkpoint at step {step}" in resumed.stderr
  (line,) = _resuming_lines(resumed.stderr)
  assert (f"resuming step {step}, trained on 2 replicas (2 workers, multi_worker_mirrored), "
          f"on 1 replica (mirrored): the same trajectory to float32 rounding") in line, line
  difference = _max_difference(_weights(tmp_path, _MLP_STEPS), mlp[1])
  print(f"mlp, 2 workers preempted at step {step}, resumed on 1 replica: {difference:.3g} "
        f"from 1 replica uninterrupted")
  assert difference <= 1e-6


# -- 3, 5: random augmentation, and a CNN whose sums are long ---------------------------


@pytest.fixture(scope="module")
def cnns(tmp_path_factory):
  """{(model, replicas): final weights} of tests/plugins/shape_plugins.py's user_cnn, 1 and 2
  replicas, 30 steps at batch 48. (RandomFlip + RandomRotation + Dropout, and synchronized
  BatchNorm, on 1 and 2 replicas and resumed from 2 on 1: the guarantee matrix's
  `augmented` and `conv_batchnorm_synchronized` workloads, tests/guarantees/.)"""
  root = tmp_path_factory.mktemp("cnns")
  runs = [(model, count) for model in ("user_cnn",) for count in (1, 2)]
  trained = _in_parallel(*[
      (lambda model=model, count=count: _trained_to(
          root / f"{model}{count}", *_CNN, f"--config.model.name=tests.plugins.shape_plugins:{model}",
          *_replicas(count), step=_CNN_STEPS)) for model, count in runs])
  return dict(zip(runs, trained))


@pytest.mark.slow
def test_a_users_cnn_trains_the_same_weights_on_1_and_2_replicas(cnns):
  """Two Conv2D, MaxPool, GlobalAveragePooling, Dense on real images: sums long enough for
  their order to show (1.9e-7). Catches a reduction or a kernel whose result depends on the
  replica's share beyond rounding (a gradient counted twice is off by 1e-2 or more)."""
  _assert_trained(cnns["user_cnn", 1])
  difference = _max_difference(cnns["user_cnn", 2], cnns["user_cnn", 1])
  print(f"user_cnn, 1 vs 2 replicas after {_CNN_STEPS} steps: {difference:.3g}")
  assert difference <= 1e-6


# -- 4: what depends on the replica count is refused ---------------------------------

_DEPENDENT = {  # name: (flags, what the refusal names)
    "batchnorm": (["--config.model.name=tests.plugins.batchnorm_plugins:conv_batchnorm", _IMAGES],
                  "BatchNormalization 'bn' (unsynchronized"),
    "generator": (["--config.train.task=tests.guarantees.workloads.task_layer_generator:LayerAndGenerator"],
                  "randomness drawn per replica (RngReadAndSkip in stateful_normal/"),
}


@pytest.fixture(scope="module")
def dependent(tmp_path_factory):
  """{name: {"before"/"after": model_dir's snapshot around the refused resume, "refused",
  "allowed": the resumes' results, "model_dir"}}: 10 steps on 2 replicas, then
  train.steps=20 on 1 replica, refused, then again with checkpoint.allow_other_trajectory."""
  root = tmp_path_factory.mktemp("dependent")
  names = sorted(_DEPENDENT)

  def run(name, *flags, env=None):
    return run_trainer(root / name, *_SYNTHETIC, *_DEPENDENT[name][0], *flags, timeout=300,
                       env=env)

  for name, first in zip(names, _in_parallel(*[
      (lambda name=name: run(name, _steps(10), *_replicas(2))) for name in names])):
    assert first.returncode == 0, f"{name}: exit {first.returncode}\n{first.stderr[-3000:]}"
  before = {name: _snapshot(root / name) for name in names}
  refused = _in_parallel(*[(lambda name=name: run(name, _steps(20), *_replicas(1)))
                           for name in names])
  after = {name: _snapshot(root / name) for name in names}
  without_tensorflow = _in_parallel(*[  # its import fails: the refusal must come first
      (lambda name=name: run(name, _steps(20), *_replicas(1),
                             env={"PYTHONPATH": _no_tensorflow(root)})) for name in names])
  allowed = _in_parallel(*[(lambda name=name: run(name, _steps(20), *_replicas(1), _ALLOW))
                           for name in names])
  return {name: {"before": before[name], "after": after[name], "refused": refused[i],
                 "without_tensorflow": without_tensorflow[i], "allowed": allowed[i],
                 "model_dir": root / name}
          for i, name in enumerate(names)}


def _no_tensorflow(root) -> str:
  """A PYTHONPATH whose `tensorflow` fails to import: what a run decides before it, it
  decides without it."""
  package = root / "no_tensorflow" / "tensorflow"
  package.mkdir(parents=True, exist_ok=True)
  (package / "__init__.py").write_text('raise ImportError("tensorflow was imported")\n')
  return str(package.parent)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_DEPENDENT))
def test_a_resume_that_would_change_the_trajectory_is_refused_in_one_line(dependent, name):
  """Catches: an unsynchronized BatchNorm (statistics of each replica's share) or a
  Generator (numbers per replica) resumed on another replica count without a word, on
  another trajectory; or refused with a traceback."""
  refused = dependent[name]["refused"]
  assert refused.returncode == 2, f"exit {refused.returncode}\n{refused.stderr[-3000:]}"
  assert "Traceback" not in refused.stderr + refused.stdout, refused.stderr[-3000:]
  (line,) = refused.error_lines()
  assert line.startswith("distloop: error: resuming step 10, trained on 2 replicas (mirrored), "
                         "on 1 replica (mirrored) would change the trajectory: "), line
  assert _DEPENDENT[name][1] in line, line
  assert line.endswith(f"resume on 2 replicas, or pass {_ALLOW} to go on on another "
                       f"trajectory (nothing was written)"), line
  assert "Restored checkpoint" not in refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_DEPENDENT))
def test_the_refusal_is_decided_before_tensorflow_starts(dependent, name):
  """The same line with TensorFlow unimportable: decided from the step's meta (its shape
  and what its trace found the trajectory depends on) and the config, before the
  plug-ins' imports start TensorFlow. Catches the refusal after the model's trace (it
  was: ~8 s of start-up on this machine, a user measured 17 s; now under 1 s)."""
  decided = dependent[name]["without_tensorflow"]
  assert decided.returncode == 2, f"exit {decided.returncode}\n{decided.stderr[-3000:]}"
  assert decided.error_lines() == dependent[name]["refused"].error_lines()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_DEPENDENT))
def test_a_refused_resume_writes_nothing(dependent, name):
  """Every file and directory of model_dir as it was: path, size, mtime and content (the
  writer lock and the start-up write probes come and go)."""
  before, after = dependent[name]["before"], dependent[name]["after"]
  assert before.get("checkpoints/10") == "directory", sorted(before)
  assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_DEPENDENT))
def test_allow_other_trajectory_goes_on_with_one_warning(dependent, name):
  allowed, model_dir = dependent[name]["allowed"], dependent[name]["model_dir"]
  assert allowed.returncode == 0, f"exit {allowed.returncode}\n{allowed.stderr[-3000:]}"
  (line,) = _resuming_lines(allowed.stderr)
  assert ("resuming step 10, trained on 2 replicas (mirrored), on 1 replica (mirrored): "
          "another trajectory, as checkpoint.allow_other_trajectory asks") in line, line
  assert _DEPENDENT[name][1] in line, line
  assert json.loads((model_dir / "summary.json").read_text())["step"] == 20


# -- 6: elastic.judge and the per-example draws, in the default suite ---------------------

_TWO = elastic.shape(replicas=2, workers=1, strategy="mirrored")
_ONE = elastic.shape(replicas=1, workers=1, strategy="mirrored")
_TWO_WORKERS = elastic.shape(replicas=2, workers=2, strategy="multi_worker_mirrored")


def _judge(recorded, now, *, deterministic=True, dependence=(), allowed=False):
  return elastic.judge(recorded, now, step=50, deterministic=deterministic,
                       dependence=list(dependence), allowed=allowed)


@pytest.mark.parametrize("recorded", [None, {}, {"replicas": "2"}, _ONE])
def test_judge_says_nothing_of_the_same_shape_or_a_step_without_one(recorded):
  assert _judge(recorded, _ONE, dependence=["BatchNormalization 'bn'"]) is None


def test_judge_the_same_replica_count_on_other_workers_is_bit_for_bit():
  said = _judge(_TWO_WORKERS, _TWO, dependence=["BatchNormalization 'bn'"])
  assert said == ("resuming step 50, trained on 2 replicas (2 workers, multi_worker_mirrored), "
                  "on 2 replicas (mirrored): the same replica count, the same trajectory "
                  "(bit for bit)")
  assert _judge(_TWO_WORKERS, _TWO, deterministic=False).endswith("(to float32 rounding)")


def test_judge_another_replica_count_is_float32_rounding():
  said = _judge(_TWO_WORKERS, _ONE)
  assert said.startswith("resuming step 50, trained on 2 replicas (2 workers, "
                         "multi_worker_mirrored), on 1 replica (mirrored): the same trajectory "
                         "to float32 rounding"), said


def test_judge_refuses_what_depends_on_the_replica_count_in_one_line():
  with pytest.raises(UserError) as refused:
    _judge(_TWO, _ONE, dependence=["BatchNormalization 'bn' (unsynchronized)"])
  message = str(refused.value)
  assert "\n" not in message
  assert message.startswith("resuming step 50, trained on 2 replicas (mirrored), on 1 replica "
                            "(mirrored) would change the trajectory: BatchNormalization 'bn' "
                            "(unsynchronized) depends on the replica count; resume on 2 "
                            "replicas, or pass "
                            "--config.checkpoint.allow_other_trajectory=true"), message
  assert message.endswith("(nothing was written)"), message


def test_judge_allowed_goes_on_on_another_trajectory():
  said = _judge(_TWO, _ONE, dependence=[f"reason {i}" for i in range(5)], allowed=True)
  assert said == ("resuming step 50, trained on 2 replicas (mirrored), on 1 replica (mirrored): "
                  "another trajectory, as checkpoint.allow_other_trajectory asks (reason 0; "
                  "reason 1; reason 2 and 2 more)"), said


def test_judge_without_deterministic_promises_a_distribution_not_numbers():
  said = _judge(_TWO, _ONE, deterministic=False)
  assert "the same in distribution, not number for number" in said, said


# One process, 2 logical CPU devices (this test process's TensorFlow is started): Keras
# alone on one replica, then 2 replicas of a MirroredStrategy inside per_example, and 2
# without it (Keras's own per-replica draws, which the check must tell apart).
_DRAWS_ON_1_AND_2_REPLICAS = textwrap.dedent("""
    import contextlib
    import json
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np
    from trainer.task import randomness

    B = 8
    x = tf.reshape(tf.range(1, B * 6 + 1, dtype=tf.float32), [B, 6])

    dropout = keras.layers.Dropout(0.5, seed=3)
    noise = keras.random.SeedGenerator(5)
    one = {"dropout": dropout(x, training=True).numpy().tolist(),
           "normal": keras.random.normal((3,), seed=noise).numpy().tolist()}

    def two(per_example):
      strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
      with strategy.scope():
        dropout = keras.layers.Dropout(0.5, seed=3)
        noise = keras.random.SeedGenerator(5)
      rows = B // 2
      local = strategy.experimental_distribute_values_from_function(
          lambda ctx: x[ctx.replica_id_in_sync_group * rows:][:rows])

      @tf.function
      def step(local):
        def replica(local):
          with randomness.per_example(B, 2) if per_example else contextlib.nullcontext():
            return dropout(local, training=True), keras.random.normal((3,), seed=noise)
        return strategy.run(replica, args=(local,))

      masked, drawn = step(local)
      results = strategy.experimental_local_results
      return {"dropout": np.concatenate([t.numpy() for t in results(masked)]).tolist(),
              "normal": [t.numpy().tolist() for t in results(drawn)]}

    print(json.dumps({"one": one, "two": two(True), "two_per_replica": two(False)}))
    """)


@pytest.fixture(scope="module")
def draws() -> dict:
  done = subprocess.run([sys.executable, "-c", _DRAWS_ON_1_AND_2_REPLICAS], capture_output=True,
                        text=True, timeout=300, cwd=REPO, env=user_environment())
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_dropout_on_2_replicas_is_kerass_mask_on_1_bit_for_bit(draws):
  """Catches: each replica drawing over its own share (replica 1 reusing replica 0's
  numbers, as Keras does, checked to differ here), or rows of another draw."""
  one, two = draws["one"]["dropout"], draws["two"]["dropout"]
  assert 0 < sum(value == 0 for row in one for value in row) < 48  # some dropped, not all
  assert two == one
  assert draws["two_per_replica"]["dropout"] != one


def test_a_draw_that_is_not_over_the_batch_is_the_same_on_both_replicas(draws):
  first, second = draws["two"]["normal"]
  assert first == second == draws["one"]["normal"]


def test_shape_dependent_draws_names_a_generator_and_not_a_dropout_drawn_per_example():
  dropout = keras.layers.Dropout(0.5, seed=3, name="drop")
  generator = tf.random.Generator.from_seed(1)

  def trace(body):
    def step(x):
      with randomness.per_example(4, 1):  # 1 replica: the default strategy's replica context
        return body(x)
    return tf.function(step).get_concrete_function(
        tf.TensorSpec([4, 6])).graph.as_graph_def()

  assert replica_dependence.shape_dependent_draws(trace(lambda x: dropout(x, training=True))) == []
  found = replica_dependence.shape_dependent_draws(
      trace(lambda x: dropout(x, training=True) + generator.normal(tf.shape(x))))
  assert found and all("stateful_normal/" in op for op in found), found
  assert any(op.startswith("RngReadAndSkip in ") for op in found), found
  # A stateless draw of your own is as per-example as its seed: not named by itself
  # (step.example_seeds' flips are per example); a Keras shuffle (MixUp's partners within
  # the replica's share) is named.
  raw = replica_dependence.shape_dependent_draws(
      trace(lambda x: x + tf.random.stateless_uniform([4, 6], seed=[1, 2])))
  assert raw == [], raw
  partners = keras.random.SeedGenerator(1)
  shuffled = replica_dependence.shape_dependent_draws(
      trace(lambda x: keras.random.shuffle(x, seed=partners)))
  assert shuffled and all(randomness.PER_REPLICA_SCOPE in op for op in shuffled), shuffled


def test_a_dropout_over_a_tensor_that_is_not_the_batch_is_kerass_own_draw():
  """Catches (found writing these tests): Dropout's noise shape is tf.shape(inputs), whose
  first element sliced out has no static value, so every Dropout input was taken for the
  replica's batch: one over two views of each example ([2 x batch, ...], as a contrastive
  model makes) failed to trace under runtime.deterministic, on any replica count
  ("Dimensions must be equal, but are 8 and 16")."""
  x = tf.reshape(tf.range(16 * 6, dtype=tf.float32), [16, 6])
  alone = keras.layers.Dropout(0.5, seed=3)(x, training=True).numpy()
  dropout = keras.layers.Dropout(0.5, seed=3)

  def step(x):
    with randomness.per_example(8, 1):  # a batch of 8, its two views: 16 rows
      return dropout(x, training=True)

  assert np.array_equal(tf.function(step)(x).numpy(), alone)


@pytest.mark.parametrize("shape", [[8, 6], [3, 4, 6]], ids=["two_views", "time_major"])
def test_a_per_example_draw_in_another_layout_counts_as_per_replica(shape):
  """Catches: a draw over the batch in a layout distloop cannot slice (two views of each
  example, [2 x batch]; a time-major [T, batch]) taken for one number per batch and left
  out of `shape_dependent_draws`: each replica would reuse the same numbers, unnamed, and
  an elastic resume of it go on silently on another trajectory. One per batch ([1, 6])
  stays the same on every replica."""
  def trace(draw_shape):
    def step(x):
      with randomness.per_example(4, 1):
        return x[0, 0] + tf.reduce_sum(keras.random.uniform(draw_shape, seed=7))
    return tf.function(step).get_concrete_function(
        tf.TensorSpec([4, 6])).graph.as_graph_def()

  found = replica_dependence.shape_dependent_draws(trace(shape))
  assert len(found) == 1 and found[0].startswith("StatelessRandomUniformV2 in "), found
  assert replica_dependence.shape_dependent_draws(trace([1, 6])) == []


def test_judge_refuses_randomness_drawn_per_replica_on_another_strategy_of_the_same_count():
  """Catches: a Task's tf.random.Generator resumed from the default strategy on one_device
  (1 replica both) logged as bit for bit: its stream differs under a distribution
  strategy. An unsynchronized BatchNorm at the same count stays the same trajectory."""
  before = elastic.shape(replicas=1, workers=1, strategy="default")
  now = elastic.shape(replicas=1, workers=1, strategy="one_device")
  with pytest.raises(UserError, match=r"depends on the strategy; resume on the default strategy"):
    elastic.judge(before, now, step=10, deterministic=True, dependence=["a Generator"],
                  allowed=False, strategy_dependence=["a Generator"])
  said = elastic.judge(before, now, step=10, deterministic=True, dependence=["BatchNorm"],
                       allowed=False)
  assert "the same replica count, the same trajectory (bit for bit)" in said


# -- the refusal from the JSON on disk, before TensorFlow starts (elastic.refuse_before_start) --

def _write_step_meta(model_dir, step: int, **meta) -> None:
  """checkpoints/<step>/meta/metadata as orbax's JsonSave writes it."""
  folder = model_dir / "checkpoints" / str(step) / "meta"
  folder.mkdir(parents=True)
  (folder / "metadata").write_text(json.dumps({"step": step, **meta}))


def _resume_config(replicas: int, *, deterministic=True, allowed=False):
  import configs  # pylint: disable=import-outside-toplevel
  config = configs.get("synthetic")
  config.runtime.strategy, config.runtime.num_cpu_devices = "mirrored", replicas
  config.runtime.deterministic = deterministic
  config.checkpoint.allow_other_trajectory = allowed
  return config


_ON_A_CPU = pytest.mark.skipif(
    elastic._shape_before_start(_resume_config(1).runtime) is None,  # pylint: disable=protected-access
    reason="a GPU's device files: the replica count is TensorFlow's to tell")


@_ON_A_CPU
def test_refuse_before_start_judges_the_newest_steps_recorded_dependence(tmp_path):
  """Catches a refusal that waits for TensorFlow, the data and the model's trace although
  the step's meta says all it needs; and one made where the restore would go on."""
  recorded = elastic.dependence(deterministic=True, replicas=["BatchNormalization 'bn'"],
                                strategy=[])
  _write_step_meta(tmp_path, 5, shape=_ONE, dependence=recorded)
  _write_step_meta(tmp_path, 10, shape=_TWO, dependence=recorded)
  with pytest.raises(UserError) as refused:
    elastic.refuse_before_start(str(tmp_path), _resume_config(1))
  assert str(refused.value).startswith(
      "resuming step 10, trained on 2 replicas (mirrored), on 1 replica (mirrored) would "
      "change the trajectory: BatchNormalization 'bn' depends on the replica count"), refused
  elastic.refuse_before_start(str(tmp_path), _resume_config(2))  # the same shape
  elastic.refuse_before_start(str(tmp_path), _resume_config(1, allowed=True))  # goes on
  # Recorded under runtime.deterministic=true: randomness then counted; judged after the restore.
  elastic.refuse_before_start(str(tmp_path), _resume_config(1, deterministic=False))


@_ON_A_CPU
def test_refuse_before_start_leaves_a_step_without_the_record_to_the_restore(tmp_path):
  _write_step_meta(tmp_path, 10, shape=_TWO)  # saved before meta recorded its dependence
  elastic.refuse_before_start(str(tmp_path), _resume_config(1))
