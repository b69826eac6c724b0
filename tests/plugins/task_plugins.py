"""Tasks that break the contract, each in its own way (tests/tasks/test_tasks.py)."""
import keras
import tensorflow as tf

import trainer


def _model():
  return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                           keras.layers.Dense(10)], name="tiny")


class _Base(trainer.Task):

  def build(self, context):
    self.model = _model()
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def _loss(self, batch):
    features, labels = batch
    return keras.losses.sparse_categorical_crossentropy(labels, self.model(features),
                                                        from_logits=True)


class AppliesTwiceUnnamed(_Base):

  def train_step(self, batch, step):
    for _ in range(2):
      with tf.GradientTape() as tape:
        per_example = self._loss(batch)
        loss = step.replica_loss(per_example)
      step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}


class UnbuiltOptimizer(_Base):

  def build(self, context):
    self.model = _model()
    self.optimizer = keras.optimizers.SGD(0.1)

  def train_step(self, batch, step):
    return {}


class ClippingOptimizer(_Base):
  """Builds its own optimizer with Keras-side clipping, which lives in apply()."""

  def build(self, context):
    self.model = _model()
    self.optimizer = keras.optimizers.SGD(0.1, global_clipnorm=1.0)
    self.optimizer.build(self.model.trainable_variables)

  def train_step(self, batch, step):
    return {}


class WrongRank(_Base):

  def train_step(self, batch, step):
    features, _ = batch
    return {"loss": tf.zeros([tf.shape(features)[0], 3])}


class NotADict(_Base):

  def train_step(self, batch, step):
    return self._loss(batch)


class NoModel(trainer.Task):

  def build(self, context):
    pass

  def train_step(self, batch, step):
    return {}


class RaisingBuild(trainer.Task):

  def build(self, context):
    raise RuntimeError("no weights here")


class NoGradient(_Base):

  def build(self, context):
    super().build(context)
    self.unused = keras.layers.Dense(3)
    self.unused.build((None, 2))
    self.optimizer.build(self.model.trainable_variables + self.unused.trainable_variables)

  def train_step(self, batch, step):
    with tf.GradientTape() as tape:
      per_example = self._loss(batch)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss,
                  self.model.trainable_variables + self.unused.trainable_variables)
    return {"loss": per_example}


def auto_named_model(model_config, input_spec):
  """Every name Keras's: `sequential_<n>`, `dense_<n>`, numbered per process."""
  del input_spec
  return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                           keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(model_config.num_classes)])


class FailsInStep(_Base):

  def train_step(self, batch, step):
    features, _ = batch
    return {"loss": features + "not a number"}  # a user's bug, reported at its line


class WithEma(_Base):
  """Extra state: an exponential moving average of the weights and a step counter, as
  variables the step assigns (the same value on every replica: ONLY_FIRST_REPLICA)."""

  def build(self, context):
    super().build(context)
    self.ema = [tf.Variable(v, trainable=False, name=f"ema_{i}",
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                for i, v in enumerate(self.model.trainable_variables)]
    self.updates = tf.Variable(0, dtype=tf.int64, trainable=False,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def train_step(self, batch, step):
    with tf.GradientTape() as tape:
      per_example = self._loss(batch)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    for average, weight in zip(self.ema, self.model.trainable_variables):
      average.assign(0.9 * average + 0.1 * weight)
    self.updates.assign_add(1)
    return {"loss": per_example}


class AssertsPastStep3(_Base):
  """A runtime check of the user's that fails in the compiled loop (step 4)."""

  def train_step(self, batch, step):
    with tf.GradientTape() as tape:
      per_example = self._loss(batch)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    tf.debugging.assert_less(step.step, tf.constant(4, tf.int64), message="step went past 3")
    return {"loss": per_example}


class ReturnsAString(_Base):

  def train_step(self, batch, step):
    features, _ = batch
    return {"loss": self._loss(batch), "note": tf.constant("fine")}


class ExportsWrongSpec(_Base):
  """export() serves the model with an input_spec of another shape."""

  def train_step(self, batch, step):
    with tf.GradientTape() as tape:
      per_example = self._loss(batch)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}

  def export(self):
    return trainer.Export(self.model, input_spec=tf.TensorSpec([None, 5], tf.float32))


class ExportsNotAModel(ExportsWrongSpec):

  def export(self):
    return trainer.Export(self.optimizer)


class ExitsInExport(ExportsWrongSpec):
  """export() calls sys.exit(0): an "I am done" that ended the run with exit 0, untrained."""

  def export(self):
    import sys  # pylint: disable=g-import-not-at-top
    sys.exit(0)


class ExitsInStep(_Base):
  """train_step calls sys.exit(0) as it is traced (Python runs once, at trace time)."""

  def train_step(self, batch, step):
    import sys  # pylint: disable=g-import-not-at-top
    sys.exit(0)


class _ReturnsScalars(_Base):
  """Trains on the loss and returns it per example, with `scalars(per_example, step)`."""

  def train_step(self, batch, step):
    with tf.GradientTape() as tape:
      per_example = self._loss(batch)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example, **self.scalars(per_example, step)}


class ScalarsOfTheReplicasShare(_ReturnsScalars):
  """Scalars of the replica's own share: they change with the replica count (issue 43)."""

  def scalars(self, per_example, step):
    return {"loss_sum": tf.reduce_sum(per_example), "loss_max": tf.reduce_max(per_example)}


class ReplicaInvariantScalars(_ReturnsScalars):
  """Per-step scalars the same on every replica, of several dtypes: the learning rate, a
  counter the step advances, and values of the global batch (step.all_gather)."""

  def build(self, context):
    super().build(context)
    self.updates = tf.Variable(0, dtype=tf.int64, trainable=False,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def scalars(self, per_example, step):
    self.updates.assign_add(1)
    rate = tf.convert_to_tensor(self.optimizer.learning_rate)
    global_losses = step.all_gather(per_example)
    return {"rate": rate, "rate_float16": tf.cast(rate, tf.float16),
            "rate_bfloat16": tf.cast(rate, tf.bfloat16), "updates": self.updates.read_value(),
            "steps_taken": tf.cast(step.step + 1, tf.int32),
            "global_loss_sum": tf.reduce_sum(global_losses),
            "global_loss_max": tf.cast(tf.reduce_max(global_losses), tf.float16)}
