"""The plainest training step, for test Tasks whose point is elsewhere (their build, their
config, what they hold): sparse cross-entropy of the model's logits, one update."""
import keras
import tensorflow as tf


def cross_entropy_step(model, optimizer, batch, step) -> dict:
  """One update of `model` by `optimizer`; returns {"loss": per-example loss}."""
  features, labels = batch
  with tf.GradientTape() as tape:
    per_example = keras.losses.sparse_categorical_crossentropy(labels, model(features),
                                                               from_logits=True)
    loss = step.replica_loss(per_example)
  step.minimize(optimizer, tape, loss, model.trainable_variables)
  return {"loss": per_example}
