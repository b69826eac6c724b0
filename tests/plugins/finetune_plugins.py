"""Two models with the same trunk and heads of different sizes, built by different
builders (so their top-level names differ too): fine-tuning with a new head."""
import keras


def _model(name, input_spec, head_units, trunk_trainable=True):
  trunk = keras.layers.Dense(32, activation="relu", name="trunk", trainable=trunk_trainable)
  return keras.Sequential([keras.Input(shape=input_spec.shape[1:]), keras.layers.Flatten(),
                           trunk, keras.layers.Dense(head_units, name="head")], name=name)


def base(model_config, input_spec):
  return _model("base", input_spec, 10)


def fine_tuned(model_config, input_spec):
  """A head of 12 classes (the data's 10 fit in it) on a frozen trunk: after training,
  the trunk is still exactly what was loaded."""
  return _model("fine_tuned", input_spec, 12, trunk_trainable=False)
