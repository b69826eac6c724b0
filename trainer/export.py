"""SavedModel export: model_dir/export/<step>/, signature `serving_default`.

Input `images`: float32 [None, 28, 28, 1] in [0, 1]; output `probabilities`:
float32 [None, 10]. The export is built from the checkpointed weights in a plain
(undistributed) copy of the model, so it loads anywhere TensorFlow runs, and is
written to a temporary directory and renamed: a crash never leaves half an export.
"""
import os
import shutil

import ml_collections
import tensorflow as tf

import models
from trainer import checkpoints


class _Serving(tf.Module):

  def __init__(self, model):
    super().__init__()
    self.model = model

  @tf.function(input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32, name="images")])
  def serve(self, images):
    logits = tf.cast(self.model(images, training=False), tf.float32)  # mixed precision: 16-bit
    return {"probabilities": tf.nn.softmax(logits, axis=-1)}


def export_dir(model_dir: str, step: int) -> str:
  return os.path.join(model_dir, "export", str(step))


def export_saved_model(model_config: ml_collections.ConfigDict, model_tree: dict,
                       destination: str) -> None:
  model = models.build(model_config)
  checkpoints.assign_tree(checkpoints.model_variables(model), model_tree)
  serving = _Serving(model)
  temporary = destination + ".tmp"
  shutil.rmtree(temporary, ignore_errors=True)
  tf.saved_model.save(serving, temporary, signatures={"serving_default": serving.serve})
  os.replace(temporary, destination)
