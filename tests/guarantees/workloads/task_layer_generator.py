"""State a user holds in other forms: a trained Keras layer as an attribute and a
tf.random.Generator (issue 31, defect 1). The Generator draws another stream on each
replica, so an elastic resume is refused."""
import keras
import tensorflow as tf

from tests.guarantees.workload import SGD, XLA_RANDOM, Workload, refused_on_two_replicas
from tests.guarantees.workloads.task_counter import Counter
from tests.plugins import task_plugins


class LayerAndGenerator(Counter):
  """Its step also goes through a Dense layer held as an attribute (trained), and draws
  input noise from a tf.random.Generator: both are state a resume needs."""

  def build(self, context):
    self.model = task_plugins._model()  # pylint: disable=protected-access
    self.scale = keras.layers.Dense(10, name="scale")
    self.scale.build((None, 10))
    self.noise = tf.random.Generator.from_seed(context.config.runtime.seed)
    self.optimizer = context.optimizer(self.model.trainable_variables
                                       + self.scale.trainable_variables)
    self.ema = [tf.Variable(v, trainable=False, name=f"ema_{i}",
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                for i, v in enumerate(self.model.trainable_variables)]
    self.updates = tf.Variable(0, dtype=tf.int64, trainable=False,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def train_step(self, batch, step):
    features, labels = batch
    variables = self.model.trainable_variables + self.scale.trainable_variables
    with tf.GradientTape() as tape:
      features += 0.05 * self.noise.normal(tf.shape(features))
      logits = self.scale(self.model(features))
      per_example = keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                 from_logits=True)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, variables)
    self.updates.assign_add(1)
    return {"loss": per_example}

  def export(self):
    return None  # the served model would leave out `scale`

  def eval_step(self, batch):
    features, labels = batch
    logits = self.scale(self.model(features))
    return {"loss": keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                 from_logits=True),
            "accuracy": tf.cast(tf.argmax(logits, -1) == labels, tf.float32)}


# What the refusal of an elastic resume names (trainer/analysis/replica_dependence.py), and why.
REFUSAL = "randomness drawn per replica"
_REPLICAS = "a tf.random.Generator draws another stream on each replica"

# Not a replica count: the same 1 replica under another strategy. A resume from the default
# strategy on one_device is not refused either; trainer/state/elastic.py logs "the same
# replica count, the same trajectory (bit for bit)", which is wrong for this Task (measured
# 1.3e-3 at step 40 after 20 steps on each, 2026-11-28; reported on issue 44).
_STRATEGY = ("a tf.random.Generator made under a distribution strategy (one_device "
                       "included) hashes the replica id into its key, under the default one it "
                       "does not (TensorFlow): another stream on the same 1 replica; "
                       "step.normal does not depend on the strategy")


WORKLOAD = Workload(
    "task_layer_generator",
    ("--config=synthetic",
     "--config.train.task=tests.guarantees.workloads.task_layer_generator:LayerAndGenerator",
     *SGD),
    refuses_elastic=REFUSAL,
    predicts=None,  # export() returns None, no predict_step
    not_applicable={**refused_on_two_replicas(_REPLICAS, REFUSAL),
                    ("shapes_agree", "xla-1"): XLA_RANDOM,
                    ("order", "one_device-of-2"): _STRATEGY})
