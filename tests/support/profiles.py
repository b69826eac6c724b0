"""What a tf.profiler trace holds, read with the protobuf classes TensorFlow ships."""
import collections


def step_markers(xplane_path: str) -> collections.Counter:
  """The step numbers of the trace's step markers -- the host's "train" events with a
  step_num stat, what TensorBoard's overview and step-time pages group by -- each with
  the times it appears."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel
  with open(xplane_path, "rb") as f:
    space = xplane_pb2.XSpace.FromString(f.read())
  steps = collections.Counter()
  for plane in space.planes:
    if plane.name != "/host:CPU":
      continue
    stat_names = {key: stat.name for key, stat in plane.stat_metadata.items()}
    for line in plane.lines:
      for event in line.events:
        if plane.event_metadata[event.metadata_id].name != "train":
          continue
        steps.update(stat.int64_value for stat in event.stats
                     if stat_names[stat.metadata_id] == "step_num")
  return steps
