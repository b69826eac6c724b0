"""The seed CNN plus Dropout after its hidden dense layer, as a model plug-in of the CLI
(benchmarks/per_example_randomness.py measures what drawing its mask per example costs).

  --config.model.name=benchmarks.dropout_cnn:build          the draws as distloop ships them
  --config.model.name=benchmarks.dropout_cnn:build_per_replica_draws
                                                           the same model, each replica's
                                                           mask drawn over its own share

models/mnist_cnn.py has no Dropout, so this is that model with Dropout(model.dropout_rate)
between `hidden` and `logits`; its other layers and their names are the built-in model's.
`build_per_replica_draws` also switches off, in this process only, what
runtime.deterministic turns on in a train step (trainer/task/randomness.py): Keras's own
draws over each replica's share, as before. A benchmark's switch, not a distloop feature.
"""
import sys

import ml_collections


# Printed to stderr by `build_per_replica_draws`: the benchmark checks that the switch ran
# (it imports this module without Keras: Keras is imported where a model is built).
SWITCHED_OFF = "benchmarks.dropout_cnn: per-example draws switched off in this process"


def build(model_config: ml_collections.ConfigDict, input_spec):
  """The seed CNN (models/mnist_cnn.py), a Dropout inserted before its logits."""
  import keras  # pylint: disable=g-import-not-at-top
  from models import mnist_cnn  # pylint: disable=g-import-not-at-top  (imports Keras)
  seed_cnn = mnist_cnn.build(model_config, input_spec)
  *body, logits = seed_cnn.layers
  return keras.Sequential(
      [keras.Input(shape=seed_cnn.input_shape[1:], name="images"), *body,
       keras.layers.Dropout(model_config.dropout_rate, name="dropout"), logits],
      name="mnist_cnn")


def build_per_replica_draws(model_config: ml_collections.ConfigDict, input_spec):
  """`build`, with StepContext.call running the train step as it would without
  runtime.deterministic (built before the step is traced, so every trace sees it)."""
  from trainer.task import contexts  # pylint: disable=g-import-not-at-top

  def call(self, train_step, batch):
    return train_step(batch, self)

  if not getattr(contexts.StepContext.call, "per_replica_draws", False):  # once a process
    call.per_replica_draws = True
    contexts.StepContext.call = call
    print(SWITCHED_OFF, file=sys.stderr, flush=True)
  return build(model_config, input_spec)
