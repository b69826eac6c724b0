"""A Keras model whose last layer is a softmax (probabilities, no second softmax)."""
from tests.guarantees.workload import DATA, SGD, Workload, classified


def served(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests.plugins import keras_plugins  # pylint: disable=import-outside-toplevel
  features, labels = keras_plugins.four_classes(DATA, seed=0)[1]
  return classified(serve(inputs=tf.constant(features))["probabilities"].numpy(), labels)


WORKLOAD = Workload("softmax_head", ("--config=synthetic",
                                     "--config.model.name=tests.plugins.keras_plugins:softmax_head",
                                     "--config.data.name=tests.plugins.keras_plugins:four_classes",
                                     *SGD),
                    served=served)
