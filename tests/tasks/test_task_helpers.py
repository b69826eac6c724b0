"""The Task helpers users reached for (issue 33, point 6): `step.all_gather` (global
negatives for a contrastive loss) and `step.example_seeds` (augmentations that do not
change with the replica count), each the same on 1 and 2 replicas; `load_weights`
errors that name the call, not config fields the user never set."""
import csv
import json
import os
import subprocess
import sys
import textwrap

import keras
import tensorflow as tf
import pytest

import configs
import trainer
from tests.plugins import plain_step
from tests.support.cli import REPO, train_ok, user_environment
from tests.support.processes import assert_same_state, checkpoint_arrays
from trainer.errors import UserError

# One process, 2 logical CPU devices: the same step context on the default strategy (1
# replica) and on a MirroredStrategy of 2 (the test process's TensorFlow is started).
_ONE_AND_TWO_REPLICAS = textwrap.dedent("""
    import json
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from trainer.task.contexts import StepContext

    B = 8
    x = tf.reshape(tf.range(B * 3, dtype=tf.float32), [B, 3])

    def run(strategy):
      n = strategy.num_replicas_in_sync
      rows = B // n
      local = strategy.experimental_distribute_values_from_function(
          lambda ctx: x[ctx.replica_id_in_sync_group * rows:(ctx.replica_id_in_sync_group + 1) * rows])

      @tf.function
      def fn(local):
        def replica(local):
          step = StepContext(step=tf.constant(3, tf.int64), global_batch_size=B,
                             num_replicas=n, seed=7, loss_scales={})
          with tf.GradientTape() as tape:
            tape.watch(local)
            gathered = step.all_gather(local)
            loss = tf.reduce_sum(gathered * gathered) / n  # each replica's share of one loss
          gradient = tape.gradient(loss, local)
          return (gathered, step.all_gather(gradient), step.all_gather(step.example_seeds(1)),
                  step.all_gather(step.seed(1)[None]))
        return strategy.run(replica, args=(local,))

      out = fn(local)
      first = lambda v: strategy.experimental_local_results(v)[0].numpy().tolist()
      return dict(zip(["gathered", "gradient", "example_seeds", "seeds"], map(first, out)))

    print(json.dumps({"one": run(tf.distribute.get_strategy()),
                      "two": run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))}))
    """)


@pytest.fixture(scope="module")
def one_and_two_replicas() -> dict:
  done = subprocess.run([sys.executable, "-c", _ONE_AND_TWO_REPLICAS], capture_output=True,
                        text=True, timeout=300, cwd=REPO, env=user_environment())
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_all_gather_is_the_global_batch_on_1_and_2_replicas(one_and_two_replicas):
  one, two = one_and_two_replicas["one"], one_and_two_replicas["two"]
  expected = [[3.0 * row + column for column in range(3)] for row in range(8)]
  assert one["gathered"] == expected
  assert two["gathered"] == expected
  # The gradient of the global loss reaches each replica's own rows: 2x, as on one replica.
  assert one["gradient"] == two["gradient"] == [[2 * v for v in row] for row in expected]


def test_example_seeds_do_not_change_with_the_replica_count(one_and_two_replicas):
  one, two = one_and_two_replicas["one"], one_and_two_replicas["two"]
  assert len(one["example_seeds"]) == 8
  assert len({tuple(seed) for seed in one["example_seeds"]}) == 8  # one per example
  assert one["example_seeds"] == two["example_seeds"]
  # step.seed() is one per replica, as documented: the replicas draw apart.
  assert len(two["seeds"]) == 2 and two["seeds"][0] != two["seeds"][1]


def _config(steps: int = 2):
  config = configs.get("synthetic")
  config.unlock()
  config.train.steps, config.train.steps_per_loop = steps, steps
  config.train.global_batch_size = 16
  config.data.num_train_examples, config.data.num_eval_examples = 64, 32
  return config


def _small_model(units: int):
  return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                           keras.layers.Dense(units, name="head")], name="small")


class _Small(trainer.Task):
  units = 10

  def build(self, context):
    self.model = _small_model(self.units)
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def train_step(self, batch, step):
    return plain_step.cross_entropy_step(self.model, self.optimizer, batch, step)


class _Student(_Small):
  teacher_dir = ""
  teacher_units = 10

  def build(self, context):
    super().build(context)
    self.teacher = _small_model(self.teacher_units)
    context.load_weights(self.teacher, self.teacher_dir)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
  model_dir = str(tmp_path_factory.mktemp("teacher"))
  trainer.run(_config(), model_dir=model_dir, task=_Small())
  return model_dir


@pytest.mark.parametrize("case", ["another_shape", "no_checkpoint"])
def test_load_weights_errors_name_the_call_not_init_from(tmp_path, teacher_dir, case):
  student = _Student()
  if case == "another_shape":
    student.teacher_dir, student.teacher_units = teacher_dir, 7
  else:
    student.teacher_dir = str(tmp_path / "empty")
    os.makedirs(student.teacher_dir)
  with pytest.raises(UserError) as raised:
    trainer.run(_config(), model_dir=str(tmp_path / "student"), task=student)
  line = str(raised.value)
  assert "\n" not in line
  assert f"load_weights('small', {student.teacher_dir!r})" in line, line
  assert "init_from" not in line and "init_partial" not in line, line
  if case == "another_shape":
    assert "small/head/" in line and "model 'small'" in line, line


class _TwoOptimizers(_Small):
  """A model in two halves, each updated by its own optimizer (a GAN's shape)."""

  def build(self, context):
    self.body = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(4)], name="body")
    self.head = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10)], name="head")
    self.body_optimizer = context.optimizer(self.body.trainable_variables)
    self.head_optimizer = context.optimizer(self.head.trainable_variables)

  def train_step(self, batch, step):
    features, labels = batch
    with tf.GradientTape(persistent=True) as tape:
      per_example = keras.losses.sparse_categorical_crossentropy(
          labels, self.head(self.body(features)), from_logits=True)
      loss = step.replica_loss(per_example)
    step.minimize(self.body_optimizer, tape, loss, self.body.trainable_variables, name="body")
    step.minimize(self.head_optimizer, tape, loss, self.head.trainable_variables, name="head")
    return {"loss": per_example}


def test_two_optimizers_log_their_learning_rates_under_their_attribute_names(tmp_path):
  trainer.run(_config(), model_dir=str(tmp_path), task=_TwoOptimizers())
  with open(tmp_path / "metrics.csv") as f:
    names = {row["name"] for row in csv.DictReader(f)}
  # Not learning_rate_adam and learning_rate_adam_1 (Keras's names, numbered per process).
  assert ({name for name in names if name.startswith("learning_rate")}
          == {"learning_rate_body_optimizer", "learning_rate_head_optimizer"}), names


@pytest.mark.slow  # two CLI runs (~35 s): the fast suite keeps the step-context checks above
def test_a_contrastive_task_with_global_negatives_trains_alike_on_1_and_2_replicas(tmp_path):
  flags = ["--config=synthetic", f"--config.train.task={REPO}/tests/plugins/contrastive_plugins.py:"
           "Contrastive", "--config.runtime.strategy=mirrored", "--config.train.steps=4",
           "--config.train.steps_per_loop=4", "--config.train.global_batch_size=16",
           "--config.data.num_train_examples=64", "--config.data.num_eval_examples=32",
           "--config.train.optimizer=sgd", "--config.runtime.deterministic=true"]
  summaries = {n: train_ok(tmp_path / str(n), *flags, f"--config.runtime.num_cpu_devices={n}")
               for n in (1, 2)}
  assert summaries[1]["train_loss"] == pytest.approx(summaries[2]["train_loss"], abs=1e-6)
  assert_same_state(checkpoint_arrays(tmp_path / "2", 4), checkpoint_arrays(tmp_path / "1", 4),
                    atol=1e-6)
