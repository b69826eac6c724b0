"""Knowledge distillation in one file: a small student learns from a frozen teacher.

The teacher is any distloop run of the built-in CNN (mnist_cnn) on the same data;
train it first, then distil it into an MLP a tenth of its size:

  python -m trainer --config=synthetic --model_dir=/tmp/distloop/teacher
  python -m trainer --config=examples/distillation.py --model_dir=/tmp/distloop/student \
      --config.distill.teacher_dir=/tmp/distloop/teacher

The teacher is built and loaded in build() (context.load_weights reads a distloop
model_dir), marked non-trainable and never handed to an optimizer: its weights
end bit for bit as they started. The student's loss per example is the
cross-entropy with the label blended with the KL divergence from the teacher's
softened distribution (temperature T, scaled by T^2, Hinton et al. 2015).
"""
import os

import keras
import tensorflow as tf

import models
import trainer
from configs import synthetic


class Distill(trainer.Task):

  def build(self, context):
    config = context.config
    self.teacher = models.BUILTINS["mnist_cnn"](config.model, context.features_spec)
    context.load_weights(self.teacher, config.distill.teacher_dir)
    self.teacher.trainable = False
    self.student = keras.Sequential([
        keras.Input(context.features_spec.shape[1:]), keras.layers.Flatten(),
        keras.layers.Dense(config.distill.student_units, activation="relu", name="hidden"),
        keras.layers.Dense(config.model.num_classes, name="logits")], name="student")
    self.optimizer = context.optimizer(self.student.trainable_variables)
    self.temperature = config.distill.temperature
    self.alpha = config.distill.alpha

  def _per_example_losses(self, features, labels, training):
    student = tf.cast(self.student(features, training=training), tf.float32)
    teacher = tf.cast(self.teacher(features, training=False), tf.float32)
    t = self.temperature
    hard = keras.losses.sparse_categorical_crossentropy(labels, student, from_logits=True)
    soft = keras.losses.kl_divergence(tf.nn.softmax(teacher / t), tf.nn.softmax(student / t))
    return self.alpha * hard + (1.0 - self.alpha) * t * t * soft, student, teacher

  def train_step(self, batch, step):
    features, labels = batch
    with tf.GradientTape() as tape:
      per_example, student, _ = self._per_example_losses(features, labels, training=True)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.student.trainable_variables)
    return {"loss": per_example, "accuracy": _accuracy(labels, student)}

  def eval_step(self, batch):
    features, labels = batch
    per_example, student, teacher = self._per_example_losses(features, labels, training=False)
    return {"loss": per_example, "accuracy": _accuracy(labels, student),
            "teacher_accuracy": _accuracy(labels, teacher),
            "agreement": tf.cast(tf.argmax(student, -1) == tf.argmax(teacher, -1), tf.float32)}

  def export(self):
    return trainer.Export(model=self.student, output_name="probabilities",
                          transform=tf.nn.softmax)


def _accuracy(labels, logits):
  return tf.cast(tf.argmax(logits, -1) == tf.cast(labels, tf.int64), tf.float32)


def get_config():
  config = synthetic.get_config()
  config.unlock()
  config.train.task = f"{os.path.abspath(__file__)}:Distill"
  config.model.num_classes = 10  # the teacher's head
  config.distill = dict(teacher_dir="", student_units=32, temperature=4.0, alpha=0.1)
  config.train.steps = 300
  config.lock()
  return config
