"""A tiny model for big records (test_records_scale.py): the data is large, the model is not."""
import keras

_BYTES_USED = 64  # of each record's blob, the model looks at the first few


def blob_model(model_config, input_spec):
  del model_config
  blob = keras.Input(shape=input_spec.shape[1:], dtype=input_spec.dtype.name, name="blob")
  head = keras.layers.Lambda(lambda b: keras.ops.cast(b[:, :_BYTES_USED], "float32") / 255.0,
                             name="head")(blob)
  return keras.Model(blob, keras.layers.Dense(10, name="logits")(head), name="blob_model")
