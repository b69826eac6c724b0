"""The seed's MLP: Flatten -> Dense(relu) -> Dropout -> Dense logits (`model.num_classes`)."""
import keras
import ml_collections

import models


def build(model_config: ml_collections.ConfigDict, input_spec) -> keras.Model:
  shape, _ = models.single_input("mlp", input_spec)
  return keras.Sequential(
      [
          keras.Input(shape=shape, name="images"),
          keras.layers.Flatten(name="flatten"),
          keras.layers.Dense(model_config.mlp_units, activation="relu", name="hidden"),
          keras.layers.Dropout(model_config.dropout_rate, name="dropout"),
          keras.layers.Dense(model_config.num_classes, name="logits"),
      ],
      name="mlp",
  )
