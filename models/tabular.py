"""Seed 1's tabular model: Dense(hidden_units, relu) -> Dense(num_outputs).

One output is a logit (binary_crossentropy) or a value (mean_squared_error).
"""
import keras
import ml_collections

import models


def build(model_config: ml_collections.ConfigDict, input_spec) -> keras.Model:
  shape, _ = models.single_input("tabular", input_spec)
  return keras.Sequential(
      [
          keras.Input(shape=shape, name="features"),
          keras.layers.Dense(model_config.hidden_units, activation="relu", name="hidden"),
          keras.layers.Dense(model_config.num_outputs, name="outputs"),
      ],
      name="tabular",
  )
