"""Two named outputs (a class head and a value head), a loss and weight each."""
import numpy as np

from tests.guarantees.workload import DATA, SGD, Workload, classified, within


def served(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests.plugins import multi_output_plugins  # pylint: disable=import-outside-toplevel
  features, labels = multi_output_plugins.arrays(DATA, seed=0)[1]
  outputs = serve(inputs=tf.constant(features))
  scores = classified(outputs["class"].numpy(), labels["class"], prefix="class_")
  squared = np.mean((outputs["value"].numpy()[:, 0].astype(np.float64) - labels["value"]) ** 2)
  return {"eval_class_accuracy": scores["eval_class_accuracy"],
          "eval_loss": scores["eval_class_loss"] + 0.5 * squared}


WORKLOAD = Workload("two_heads", ("--config=synthetic",
                                  "--config.model.name=tests.plugins.multi_output_plugins:two_heads",
                                  "--config.data.name=tests.plugins.multi_output_plugins:arrays",
                                  "--config.train.loss=class=sparse_categorical_crossentropy,"
                                  "value=mean_squared_error",
                                  "--config.train.loss_weights=value=0.5",
                                  "--config.eval.metrics=class=accuracy", *SGD),
                    served=served, eval_examples=1000,
                    agree_within=within(2e-7))  # measured 6.0e-8 (2, central_storage), 7.5e-8 (XLA)
