"""The seed's CNN: Conv2D(3x3, relu) -> MaxPool 2x2 -> Flatten -> Dense(relu) -> Dense logits.

Takes images of any size with a channel axis ([H, W, C]); `model.num_classes` logits.
"""
import keras
import ml_collections

import models


def build(model_config: ml_collections.ConfigDict, input_spec) -> keras.Model:
  shape, _ = models.single_input("mnist_cnn", input_spec)
  return keras.Sequential(
      [
          keras.Input(shape=shape, name="images"),
          keras.layers.Conv2D(model_config.conv_filters, 3, activation="relu", name="conv"),
          keras.layers.MaxPooling2D(2, name="pool"),
          keras.layers.Flatten(name="flatten"),
          keras.layers.Dense(model_config.dense_units, activation="relu", name="hidden"),
          keras.layers.Dense(model_config.num_classes, name="logits"),
      ],
      name="mnist_cnn",
  )
