"""Models whose trajectory must not depend on the replica count (issue 44), as a user
writes them from the plug-in contract: random layers, a CNN whose sums are long."""
import keras


def user_cnn(model_config, input_spec):
  """Two Conv2D, MaxPool, GlobalAveragePooling, Dense: the CNN a newcomer writes."""
  del model_config
  inputs = keras.Input(shape=input_spec.shape[1:], name="images")
  x = keras.layers.Conv2D(16, 3, activation="relu", name="conv1")(inputs)
  x = keras.layers.MaxPooling2D(name="pool1")(x)
  x = keras.layers.Conv2D(32, 3, activation="relu", name="conv2")(x)
  x = keras.layers.GlobalAveragePooling2D(name="pool2")(x)
  return keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="user_cnn")


def augmented(model_config, input_spec):
  """RandomFlip + RandomRotation on the images, then a small CNN with Dropout: each
  example's flip, angle and mask must be its own on any replica count."""
  del model_config
  inputs = keras.Input(shape=input_spec.shape[1:], name="images")
  x = keras.layers.RandomFlip("horizontal", seed=1, name="flip")(inputs)
  x = keras.layers.RandomRotation(0.1, seed=2, name="rotate")(x)
  x = keras.layers.Conv2D(8, 3, activation="relu", name="conv")(x)
  x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
  x = keras.layers.Dense(16, activation="relu", name="hidden")(x)
  x = keras.layers.Dropout(0.3, seed=3, name="dropout")(x)
  return keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="augmented")
