"""The built-in step: one model, one loss, metrics, one optimizer -- a Task like a user's.

Built from the config: model.name (a built-in or MODULE:FUNCTION builder),
train.loss, eval.metrics, train.optimizer / learning_rate / lr_schedule,
train.from_logits. At build it runs the start-up checks on real examples
(trainer/supervised/compatibility.py: the model fits the data, the loss and every metric
return per-example values, no compile()d training config of its own) and
decides logits or probabilities (trainer/supervised/probabilities.py).

Its train_step reports `loss` (the data loss + model.losses, as differentiated),
`regularization_loss` (model.losses alone) and every metric as train_<name>; its
eval_step `loss` (the data loss) and every metric. With XLA on several replicas
its forward and backward are one compiled piece per replica (the update is one
per device, around the one all-reduce); with one replica the whole step is.
"""
import ml_collections
import tensorflow as tf

import input_pipelines
import models
from trainer.supervised import compatibility
from trainer.setup import heads
from trainer.task import contract
from trainer.supervised import losses
from trainer.supervised import metrics
from trainer.setup import plugins
from trainer.supervised import probabilities
from trainer.setup import validation
from trainer.errors import UserError


def _outputs(model, features, training: bool, names):
  """float32 outputs whatever the compute dtype (mixed precision computes in 16 bits):
  one tensor, or {output name: tensor} (trainer/setup/heads.py)."""
  outputs = heads.as_dict(model(features, training=training), names)
  return tf.nest.map_structure(lambda output: tf.cast(output, tf.float32), outputs)


class SupervisedTask(contract.Task):
  """model(features) -> outputs; train.loss(labels, outputs); eval.metrics. Per output
  (a head) when the model returns several: trainer/setup/heads.py."""

  def build(self, context) -> None:
    config = context.config
    train_source, eval_source = context.sources
    self.model_config, self.num_classes_from = model_config(config, context.sources)
    self.model = plugins.build_model(self.model_config, context.features_spec)
    features, labels = context.probe
    probe_outputs = compatibility.model_outputs(config, self.model, features)  # builds it
    self._output_names = heads.output_names(self.model, probe_outputs)
    probe_outputs = heads.as_dict(probe_outputs, self._output_names)
    compatibility.check_labels_fit_outputs(config, self._output_names, labels)
    loss_names = heads.losses_by_output(config, self._output_names)
    weights = heads.weights_by_output(config, self._output_names)
    metric_specs = heads.metrics_by_output(config, validation.metric_specs(config.eval),
                                           self._output_names)
    self._heads = []
    for output, loss_name in loss_names.items():
      head_outputs = probe_outputs if output is None else probe_outputs[output]
      head_labels = labels if output is None else labels[output]
      # Logits or probabilities (train.from_logits): decides the loss, thresholds, export.
      are_probabilities = probabilities.decide(config, self.model, head_outputs,
                                               loss_name=loss_name, output=output)
      head = heads.Head(
          output=output, loss_name=loss_name, weight=weights[output],
          loss=losses.resolve(loss_name, probabilities=are_probabilities),
          metrics=metrics.resolve(config.eval, loss_name, probabilities=are_probabilities,
                                  specs=metric_specs[output]),
          probabilities=are_probabilities)
      compatibility.check(config, head, head_outputs, head_labels, train_source, eval_source)
      self._heads.append(head)
    self.outputs_are_probabilities = self._heads[0].probabilities  # (one output: its own)
    self.optimizer = context.optimizer(self.model.trainable_variables)
    self._accumulation_steps = config.train.accumulation_steps
    self._features_spec = context.features_spec
    self._feature_name = train_source.feature_name

  def _loss(self, labels, outputs) -> tuple[tf.Tensor, dict]:
    """(per-example loss: the weighted sum over heads, {head's loss name: per-example})."""
    if len(self._heads) == 1 and self._heads[0].output is None:
      loss = self._heads[0].loss(labels, outputs)
      return loss, {}
    parts = {head.name("loss"): head.loss(labels[head.output], outputs[head.output])
             for head in self._heads}
    total = tf.add_n([head.weight * parts[head.name("loss")] for head in self._heads])
    return total, parts

  def _metric_values(self, labels, outputs) -> dict:
    values = {}
    for head in self._heads:
      head_labels, head_outputs = ((labels, outputs) if head.output is None
                                   else (labels[head.output], outputs[head.output]))
      values.update({head.name(name): fn(head_labels, head_outputs)
                     for name, fn in head.metrics.items()})
    return values

  def train_step(self, batch, step) -> dict:
    features, labels = batch
    variables = self.model.trainable_variables

    def forward_backward(features, labels, regularization_weight=1.0):
      with tf.GradientTape() as tape:
        outputs = _outputs(self.model, features, True, self._output_names)
        per_example_loss, parts = self._loss(labels, outputs)
        regularization = None
        if self.model.losses:  # the whole model's term, once per step
          regularization = tf.cast(tf.add_n(self.model.losses), tf.float32)
        loss = step.replica_loss(per_example_loss, None if regularization is None
                                 else regularization * regularization_weight)
      return (step.gradients(self.optimizer, tape, loss, variables), per_example_loss, parts,
              outputs, regularization)

    if step.jit_compile:  # several replicas under XLA: forward and backward compiled apart
      forward_backward = tf.function(forward_backward, jit_compile=True, autograph=False)
    if self._accumulation_steps > 1:
      grads, values = self._accumulate(step, forward_backward, features, labels)
    else:
      grads, per_example_loss, parts, outputs, regularization = forward_backward(features,
                                                                                 labels)
      values = self._values(labels, outputs, per_example_loss, parts, regularization)
    step.apply_gradients(self.optimizer, grads, variables)  # once per step, k or not
    return values

  def _values(self, labels, outputs, per_example_loss, parts, regularization) -> dict:
    if regularization is None:
      regularization = tf.constant(0.0)
    return {"loss": per_example_loss + regularization,  # as differentiated
            "regularization_loss": regularization, **parts,
            **self._metric_values(labels, outputs)}

  def _accumulate(self, step, forward_backward, features, labels):
    """train.accumulation_steps = k: the replica's batch as k micro-batches, one after the
    other in a tf.while_loop (only one micro-batch's activations alive at a time), their
    gradients summed. Each micro-batch's loss is already divided by the global batch, so
    the sum is the whole batch's gradient, which apply_gradients then reduces once.
    model.losses count once per step (on the first micro-batch); per-example values come
    back in the batch's order."""
    k = self._accumulation_steps
    def split(tensor):  # [b, ...] -> [k, b / k, ...]; a padded length may be unknown
      return tf.reshape(tensor, tf.concat([[k, -1], tf.shape(tensor)[1:]], axis=0))
    features, labels = tf.nest.map_structure(split, (features, labels))
    variables = self.model.trainable_variables
    names = ["loss", "regularization_loss",
             *([head.name("loss") for head in self._heads if head.output is not None]),
             *[head.name(name) for head in self._heads for name in head.metrics]]

    def body(i, sums, gathered):
      micro_features, micro_labels = tf.nest.map_structure(lambda t: t[i], (features, labels))
      with step.micro_batch():  # each micro-batch draws with the seed's next value
        grads, per_example_loss, parts, outputs, regularization = forward_backward(
            micro_features, micro_labels, tf.cast(tf.equal(i, 0), tf.float32))
      values = self._values(micro_labels, outputs, per_example_loss, parts, regularization)
      sums = [total + tf.convert_to_tensor(grad) for total, grad in zip(sums, grads)]
      gathered = [array.write(i, tf.cast(values[name], tf.float32))
                  for name, array in zip(names, gathered)]
      return i + 1, sums, gathered

    _, sums, gathered = tf.while_loop(
        lambda i, *_: i < k, body,
        (tf.constant(0), [tf.zeros_like(v.value) for v in variables],
         [tf.TensorArray(tf.float32, size=k) for _ in names]),
        name="accumulate_micro_batches")
    values = {name: tf.reshape(array.stack(), [-1]) for name, array in zip(names, gathered)}
    values["regularization_loss"] = values["regularization_loss"][0]  # the same in each
    return sums, values

  def eval_step(self, batch) -> dict:
    features, labels = batch
    outputs = _outputs(self.model, features, False, self._output_names)
    loss, parts = self._loss(labels, outputs)
    return {"loss": loss, **parts, **self._metric_values(labels, outputs)}

  def export(self) -> contract.Export:
    from trainer.state import export  # pylint: disable=g-import-not-at-top
    served = {head.output: losses.served_output(head.loss_name,
                                                probabilities=head.probabilities)
              for head in self._heads}
    if None in served:  # one output: served as probabilities or predictions
      output_name, transform = served[None]
    else:  # every output under its own name
      names = self._output_names
      output_name = None
      transform = lambda outputs: {  # pylint: disable=unnecessary-lambda-assignment
          name: served[name][1](output)
          for name, output in heads.as_dict(outputs, names).items()}
    return contract.Export(
        model=self.model, output_name=output_name, transform=transform,
        input_spec=export.serving_spec(self._features_spec, self._feature_name),
        build=lambda spec: plugins.build_model(self.model_config, spec))


def model_config(config: ml_collections.ConfigDict, splits
                 ) -> tuple[ml_collections.ConfigDict, str | None]:
  """config.model with `num_classes` resolved: 0 means "from the data" (the class folders,
  the MNIST family's 10, the largest integer label + 1). A built-in model that needs it is
  refused when the data cannot say; a user's builder gets 0 then. The recorded config
  keeps 0, as given. Also returns what gave the count (for the start log), or None."""
  model_config_ = config.model
  if model_config_.num_classes:
    return model_config_, None
  found = input_pipelines.num_classes(*splits)
  if found is None:
    if model_config_.name in models.NEEDS_NUM_CLASSES:
      raise UserError(
          f"model.num_classes=0 (from the data), but data.name={config.data.name!r} cannot say "
          f"how many classes it has (labels that are not integer class ids, a dict of labels, "
          f"or a tf.data stream); set model.num_classes")
    return model_config_, None
  count, source = found
  model_config_ = ml_collections.ConfigDict(model_config_.to_dict())
  model_config_.num_classes = count
  return model_config_, source
