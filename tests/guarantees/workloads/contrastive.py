"""step.all_gather (global negatives) and step.example_seeds (per-example augmentation)."""
from tests.guarantees.workload import SGD, XLA_RANDOM, Workload, within

WORKLOAD = Workload(
    "contrastive",
    ("--config=synthetic", "--config.train.task=tests.plugins.contrastive_plugins:Contrastive",
     *SGD),
    evaluates=False,
    predicts=None,  # no export(), no predict_step
    agree_within=within(2e-7),  # measured 6.7e-8 (2, central_storage)
    not_applicable={("shapes_agree", "xla-1"): XLA_RANDOM,
                    "eval": "Contrastive has no eval_step: --mode=eval refuses it "
                            "(tests/tasks/test_task_without_eval.py)"},
    # Its flips are drawn per example (seeds from step.example_seeds, as that method's
    # docstring shows): 1 = 2 replicas holds (6.7e-8 above), and so does its elastic resume.
)
