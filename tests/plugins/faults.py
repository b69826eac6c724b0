"""Plug-ins that make training go non-finite on purpose, deterministically (used by the
rollback tests).

- `nan_example`: a `data.preprocess` that turns one training example of the stream
  (position POISONED_EXAMPLE) into NaNs: the loop that reads it diverges; a rollback
  skips past it and training goes on, finite.
- `exploding_gradient_loss`: a `train.loss` whose value is the cross-entropy but whose
  gradient, once the environment sets EXPLODE_GRADIENTS=1, is 1e25 times it: Adam's
  second moment overflows to Inf while the loss and the weights stay finite
  (m / sqrt(Inf) = 0), so only an optimizer slot is non-finite. (A switch, not another
  loss: a resume may not change train.loss.)
- `large_loss`: 1e4 times the cross-entropy: under float16 its gradients overflow at
  the initial loss scale (2**15) until the scale has been halved enough.
"""
import os

import tensorflow as tf

POISONED_EXAMPLE = 1250  # at batch 48: step 27 (examples 1248..1295)


def nan_example(features, labels, seed):
  position = seed[1]
  poison = tf.where(position == POISONED_EXAMPLE, float("nan"), 0.0)
  return features + tf.cast(poison, features.dtype), labels


def exploding_gradient_loss(labels, outputs):
  loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32),
                                                        logits=outputs)
  if os.environ.get("EXPLODE_GRADIENTS") != "1":
    return loss
  huge = 1e25 * loss
  return loss + (huge - tf.stop_gradient(huge))  # the same value, a 1e25 times larger gradient


def large_loss(labels, outputs):
  return 1e4 * tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.int32), logits=outputs)
