"""The feature spec of converted records: how each feature is stored, and what the model sees.

A record is one example, a serialized `tf.train.Example` (as in TFDS's
array_record files), so the records are readable without distloop. The spec
(manifest.json's "features", or the converter's --features for TFRecord input)
maps each key of the Example to:

  encoding  "raw"   one bytes value: the array's bytes (dtype, little-endian, C order)
            "int64" an int64 list of prod(shape) values
            "float" a float list of prod(shape) values
            "image" one bytes value: an encoded PNG/JPEG/GIF/BMP, decoded when read
                    (to `shape` [H, W, C]: C channels, resized bilinearly if needed)
  dtype     what is stored: any numpy number dtype for raw; int64, float32; uint8 (image)
  shape     per example, as the model sees it
  cast      optional: the dtype the model sees (e.g. float32 for uint8 pixels)
  scale     optional: divide by this after the cast (255 maps pixels to [0, 1])

The key named by `label` is the labels; the other keys are the features: one
key gives a bare tensor (its key is the SavedModel's input name), several a
dict. Checking happens in numpy; encoding and decoding in TensorFlow, which is
imported only when they run.
"""
import numpy as np

from input_pipelines.errors import DataError

ENCODINGS = ("raw", "int64", "float", "image")
_STORED = {"int64": "int64", "float": "float32", "image": "uint8"}


def check(spec, label, where: str) -> dict:
  """The spec, normalized ({key: {encoding, dtype, shape, cast, scale}}); DataError otherwise."""
  if not isinstance(spec, dict) or not spec:
    raise DataError(f"{where}: the feature spec must be a non-empty JSON object "
                    f"{{key: {{\"encoding\": ..., \"shape\": [...]}}}}")
  if label not in spec:
    raise DataError(f"{where}: the label key {label!r} is not in the feature spec "
                    f"({', '.join(map(repr, spec))})")
  if len(spec) < 2:
    raise DataError(f"{where}: the feature spec has only the label {label!r}; no features")
  return {key: _check_one(key, value, f"{where}: feature {key!r}") for key, value in spec.items()}


def _check_one(key, value, where: str) -> dict:
  if not isinstance(key, str) or not key:
    raise DataError(f"{where}: keys must be non-empty strings")
  if not isinstance(value, dict):
    raise DataError(f"{where}: must be an object with 'encoding' and 'shape'")
  unknown = set(value) - {"encoding", "dtype", "shape", "cast", "scale"}
  if unknown:
    raise DataError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
  encoding = value.get("encoding")
  if encoding not in ENCODINGS:
    raise DataError(f"{where}: encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
  dtype = value.get("dtype", _STORED.get(encoding))
  if dtype is None:
    raise DataError(f"{where}: encoding 'raw' needs a dtype (e.g. 'uint8')")
  dtype = _dtype(dtype, where)
  if encoding in _STORED and dtype != np.dtype(_STORED[encoding]):
    raise DataError(f"{where}: encoding {encoding!r} stores {_STORED[encoding]}, not {dtype}")
  shape = value.get("shape")
  if (not isinstance(shape, list) or
      not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
    raise DataError(f"{where}: shape must be a list of positive integers, got {shape!r}")
  if encoding == "image" and (len(shape) != 3 or shape[2] not in (1, 3, 4)):
    raise DataError(f"{where}: an image's shape is [height, width, channels] with 1, 3 or "
                    f"4 channels, got {shape}")
  cast = _dtype(value["cast"], where) if value.get("cast") else None
  scale = value.get("scale")
  if scale is not None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
      raise DataError(f"{where}: scale must be a positive number, got {scale!r}")
    if (cast or dtype).kind != "f":
      raise DataError(f"{where}: scale needs a float dtype (set cast to 'float32')")
  return {"encoding": encoding, "dtype": dtype.name, "shape": list(shape),
          "cast": cast.name if cast else None, "scale": scale}


def _dtype(name, where: str) -> np.dtype:
  try:
    dtype = np.dtype(name)
  except TypeError:
    raise DataError(f"{where}: {name!r} is not a dtype") from None
  if dtype.kind not in "biuf":
    raise DataError(f"{where}: dtype {dtype} is not a number type")
  return dtype


def feature_keys(spec: dict, label: str) -> list[str]:
  """The model's features, in spec order (the label left out)."""
  return [key for key in spec if key != label]


# Encoding (the converter) ------------------------------------------------------------------

def encoder(spec: dict):
  """`encode(example) -> bytes`: one example {key: numpy array, or the encoded bytes of an
  image} as a serialized tf.train.Example (everything per spec worked out once)."""
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  fields = [(key, field["encoding"], int(np.prod(field["shape"])),
             np.dtype(field["dtype"]).newbyteorder("<")) for key, field in spec.items()]

  def encode(example: dict) -> bytes:
    record = example_pb2.Example()
    out = record.features.feature
    for key, encoding, size, dtype in fields:
      value = example[key]
      if encoding == "image":
        out[key].bytes_list.value.append(bytes(value))
        continue
      array = np.asarray(value)
      if array.size != size:
        raise DataError(f"feature {key!r} has {array.size} values, its spec {size}")
      if encoding == "raw":
        out[key].bytes_list.value.append(np.ascontiguousarray(array, dtype=dtype).tobytes())
      elif encoding == "int64":
        out[key].int64_list.value.extend(array.ravel().tolist())
      else:
        out[key].float_list.value.extend(array.ravel().tolist())
    return record.SerializeToString(deterministic=True)  # map order: the same bytes in every process
  return encode


def problem_with(spec: dict, serialized: bytes) -> str | None:
  """What keeps a record from decoding with `spec`, found without running TensorFlow (a
  multi-worker runtime must not start before its strategy); None if it fits."""
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  record = example_pb2.Example()
  try:
    record.ParseFromString(serialized)
  except Exception:  # pylint: disable=broad-except  (protobuf's DecodeError)
    return "not a serialized tf.train.Example"
  stored = record.features.feature
  for key, field in spec.items():
    if key not in stored:
      return f"no feature {key!r} (it has {', '.join(sorted(stored)) or 'none'})"
    kind = {"raw": "bytes_list", "image": "bytes_list", "int64": "int64_list",
            "float": "float_list"}[field["encoding"]]
    if stored[key].WhichOneof("kind") != kind:
      return f"feature {key!r} is a {stored[key].WhichOneof('kind')}, its encoding needs a {kind}"
    values = getattr(stored[key], kind).value
    size = int(np.prod(field["shape"]))
    if field["encoding"] == "raw":
      expected = size * np.dtype(field["dtype"]).itemsize
      if len(values) != 1 or len(values[0]) != expected:
        return (f"feature {key!r} holds {sum(len(v) for v in values)} bytes, its shape "
                f"{field['shape']} of {field['dtype']} needs {expected}")
    elif field["encoding"] == "image":
      if len(values) != 1:
        return f"feature {key!r} holds {len(values)} values, an image is one"
    elif len(values) != size:
      return f"feature {key!r} holds {len(values)} values, its shape {field['shape']} needs {size}"
  return None


# Decoding (the pipeline, per batch of records) -------------------------------------------

def decode(spec: dict, label: str, serialized):
  """string [b] of serialized Examples -> (features, labels), each [b, *shape]."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  parse = {}
  for key, field in spec.items():
    if field["encoding"] in ("raw", "image"):
      parse[key] = tf.io.FixedLenFeature([], tf.string)
    else:
      parse[key] = tf.io.FixedLenFeature(field["shape"], tf.as_dtype(field["dtype"]))
  parsed = tf.io.parse_example(serialized, parse)
  values = {key: _finish(field, _decoded(field, parsed[key])) for key, field in spec.items()}
  keys = feature_keys(spec, label)
  features = values[keys[0]] if len(keys) == 1 else {key: values[key] for key in keys}
  return features, values[label]


def _decoded(field: dict, parsed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  shape = field["shape"]
  if field["encoding"] == "raw":
    flat = tf.io.decode_raw(parsed, tf.as_dtype(field["dtype"]), little_endian=True)
    return tf.reshape(flat, [-1, *shape])
  if field["encoding"] != "image":
    return parsed
  height, width, channels = shape

  def one(encoded):  # per example: images may differ in size and format
    image = tf.io.decode_image(encoded, channels=channels, dtype=tf.uint8,
                               expand_animations=False)
    def resized():
      pixels = tf.image.resize(image, [height, width], antialias=True)
      return tf.cast(tf.clip_by_value(tf.round(pixels), 0, 255), tf.uint8)
    same_size = tf.reduce_all(tf.shape(image)[:2] == [height, width])
    return tf.ensure_shape(tf.cond(same_size, lambda: image, resized), shape)
  return tf.map_fn(one, parsed, fn_output_signature=tf.TensorSpec(shape, tf.uint8))


def _finish(field: dict, value):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if field["cast"]:
    value = tf.cast(value, tf.as_dtype(field["cast"]))
  if field["scale"] is not None:
    value = value / tf.constant(field["scale"], value.dtype)
  return value
