"""AdamW with an EMA of the weights and 2 micro-batches a step (plain SGD for shapes_agree)."""
from tests.guarantees.workload import SGD, Workload, served_cnn, within

WORKLOAD = Workload("adamw_ema_accumulation",
                    ("--config=synthetic", "--config.model.conv_filters=6",
                     "--config.model.dense_units=16", "--config.train.optimizer=adamw",
                     "--config.train.learning_rate=0.005", "--config.train.ema_decay=0.9",
                     "--config.train.accumulation_steps=2"),
                    served=served_cnn, sgd_flags=SGD,
                    # measured 6.7e-8 (2, central_storage), 1.2e-7 (XLA)
                    agree_within={**within(2e-7), "xla-1": 3e-7})
