"""Multi-output models: each named output is a head with its own loss, weight and metrics.

A model returns one tensor, or a dict (or list) of them. With several, each
output is a head, named by its dict key (a list's by `model.output_names`):

    train.loss          "class=sparse_categorical_crossentropy,value=mean_squared_error"
                        (one per output), or one name for every output
    train.loss_weights  "class=1.0,value=0.5" (an output not named: 1)
    eval.metrics        "class=accuracy,value=mean_absolute_error" (OUTPUT=METRIC)

The labels are a dict keyed by the same names (all three source forms carry
one). Per example, the step's loss is sum(weight * head loss); reported are
`loss` (that sum), `<output>_loss` for each head and `<output>_<metric>` for
each metric, everywhere a single output's `loss` and `<metric>` are
(TensorBoard, summary.json, metrics.csv, --mode=eval). The export serves every
output by its name: the cross-entropies' as probabilities, the others as they are.

A one-output model is one head named None: its names stay `loss`, `<metric>`.
Parsing is pure Python (validation.py checks the config before TensorFlow loads).
"""
import dataclasses
from typing import Callable

from trainer.errors import UserError


def per_output(field: str, text: str) -> dict[str, str] | None:
  """"a=x,b=y" -> {"a": "x", "b": "y"}; a text without "=" -> None (one value for all)."""
  if "=" not in text:
    return None
  found = {}
  for entry in [part.strip() for part in text.split(",") if part.strip()]:
    output, sep, value = (part.strip() for part in entry.partition("="))
    if not sep or not output or not value:
      raise UserError(f"{field}={text!r}: {entry!r} is not OUTPUT=VALUE (write every entry "
                      f"as OUTPUT=VALUE, or give one value for every output)")
    if output in found:
      raise UserError(f"{field}={text!r}: output {output!r} is named twice")
    found[output] = value
  return found


def loss_weights(text: str) -> dict[str, float]:
  """train.loss_weights: {output: weight >= 0}; "" -> {} (every weight 1)."""
  if not str(text).strip():
    return {}
  named = per_output("train.loss_weights", str(text))
  if named is None:
    raise UserError(f"train.loss_weights={text!r} must name outputs: OUTPUT=WEIGHT,... "
                    f"(e.g. class=1.0,value=0.5)")
  weights = {}
  for output, value in named.items():
    try:
      weights[output] = float(value)
    except ValueError:
      raise UserError(f"train.loss_weights={text!r}: {value!r} ({output}) is not a "
                      f"number") from None
    if not weights[output] >= 0:
      raise UserError(f"train.loss_weights={text!r}: the weight of {output!r} must be >= 0")
  return weights


def metric_entries(specs: list[str]) -> list[tuple[str | None, str]]:
  """eval.metrics entries -> (output or None, metric spec)."""
  entries = []
  for spec in specs:
    output, sep, metric = spec.partition("=")
    entries.append((output.strip(), metric.strip()) if sep else (None, spec))
  return entries


def reported_name(output: str | None, name: str) -> str:
  return f"{output}_{name}" if output else name


def check_config(config) -> list[str]:
  """What a config can check before the model exists: the per-output fields parse and
  agree. Returns the names reported for eval (for checkpoint.best_metric)."""
  losses = per_output("train.loss", config.train.loss)
  weights = loss_weights(config.train.loss_weights)
  if weights and losses is not None and set(weights) - set(losses):
    raise UserError(f"train.loss_weights names {sorted(set(weights) - set(losses))}, which "
                    f"train.loss={config.train.loss!r} does not")
  return [reported_name(output, "loss") for output in (losses or {})]


@dataclasses.dataclass
class Head:
  """One output: its loss (per example), weight, metrics and what the export serves."""
  output: str | None  # None: the model's one output
  loss_name: str
  loss: Callable
  weight: float
  metrics: dict[str, Callable]  # bare metric name -> per-example function
  probabilities: bool  # the outputs are probabilities (train.from_logits)

  def name(self, value: str) -> str:
    return reported_name(self.output, value)


def output_names(model, outputs) -> list[str] | None:
  """The outputs' names: a dict's keys, a list's `model.output_names`; None for one
  tensor. A one-entry dict or list is still named (its labels are a dict)."""
  if isinstance(outputs, dict):
    return [str(key) for key in outputs]
  if isinstance(outputs, (list, tuple)):
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != len(outputs) or len(set(names)) != len(names):
      names = [f"output_{index}" for index in range(len(outputs))]
    return names
  return None


def as_dict(outputs, names: list[str] | None):
  """A list of outputs as {name: tensor}; one tensor or a dict as they are."""
  if names is None or isinstance(outputs, dict):
    return outputs
  return dict(zip(names, outputs))


def losses_by_output(config, names: list[str] | None) -> dict[str | None, str]:
  """{output: loss spec} for the model's outputs; UserError if train.loss names others."""
  named = per_output("train.loss", config.train.loss)
  if names is None:
    if named is not None:
      raise UserError(f"train.loss={config.train.loss!r} names outputs, but "
                      f"model.name={config.model.name!r} returns one tensor: give one loss")
    return {None: config.train.loss}
  if named is None:
    return {name: config.train.loss for name in names}
  if set(named) != set(names):
    raise UserError(f"train.loss={config.train.loss!r} names outputs {sorted(named)}, but "
                    f"model.name={config.model.name!r} returns {sorted(names)}: name each "
                    f"output once")
  return {name: named[name] for name in names}


def weights_by_output(config, names: list[str] | None) -> dict[str | None, float]:
  weights = loss_weights(config.train.loss_weights)
  if names is None:
    if weights:
      raise UserError(f"train.loss_weights={config.train.loss_weights!r} weighs outputs, but "
                      f"model.name={config.model.name!r} returns one tensor")
    return {None: 1.0}
  unknown = sorted(set(weights) - set(names))
  if unknown:
    raise UserError(f"train.loss_weights names {unknown}, but model.name="
                    f"{config.model.name!r} returns {sorted(names)}")
  return {name: weights.get(name, 1.0) for name in names}


def metrics_by_output(config, specs: list[str], names: list[str] | None
                      ) -> dict[str | None, list[str]]:
  """{output: [metric spec]}; every entry names its output when there are several."""
  found = {name: [] for name in (names or [None])}
  for output, spec in metric_entries(specs):
    if names is None and output is not None:
      raise UserError(f"eval.metrics={config.eval.metrics!r} names output {output!r}, but "
                      f"model.name={config.model.name!r} returns one tensor")
    if names is not None and output is None:
      raise UserError(f"eval.metrics={config.eval.metrics!r}: {spec!r} does not say which "
                      f"output it measures; model.name={config.model.name!r} returns "
                      f"{', '.join(names)}: write OUTPUT=METRIC (e.g. {names[0]}={spec}), "
                      f"or eval.metrics='' for none")
    if output not in found:
      raise UserError(f"eval.metrics={config.eval.metrics!r} names output {output!r}; "
                      f"model.name={config.model.name!r} returns {', '.join(names)}")
    found[output].append(spec)
  return found
