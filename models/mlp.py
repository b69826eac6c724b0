"""The seed's MLP: Flatten -> Dense(relu) -> Dropout -> Dense(10) logits."""
import keras
import ml_collections


def build(model_config: ml_collections.ConfigDict) -> keras.Model:
  return keras.Sequential(
      [
          keras.Input(shape=(28, 28, 1), name="images"),
          keras.layers.Flatten(name="flatten"),
          keras.layers.Dense(model_config.mlp_units, activation="relu", name="hidden"),
          keras.layers.Dropout(model_config.dropout_rate, name="dropout"),
          keras.layers.Dense(10, name="logits"),
      ],
      name="mlp",
  )
