"""The seed's CNN: Conv2D(3x3, relu) -> MaxPool 2x2 -> Flatten -> Dense(relu) -> Dense(10) logits."""
import keras
import ml_collections


def build(model_config: ml_collections.ConfigDict) -> keras.Model:
  return keras.Sequential(
      [
          keras.Input(shape=(28, 28, 1), name="images"),
          keras.layers.Conv2D(model_config.conv_filters, 3, activation="relu", name="conv"),
          keras.layers.MaxPooling2D(2, name="pool"),
          keras.layers.Flatten(name="flatten"),
          keras.layers.Dense(model_config.dense_units, activation="relu", name="hidden"),
          keras.layers.Dense(10, name="logits"),
      ],
      name="mnist_cnn",
  )
