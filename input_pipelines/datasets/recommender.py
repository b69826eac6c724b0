"""Learnable clicks of users on items, made from the seed alone (the recommender example).

Every user and item has a hidden taste vector (8 dimensions); a user clicks an item
when their dot product is positive. Examples are [user_id, item_id] pairs (int32)
with that click (0/1). An embedding model can learn the ids' tastes only from the
examples it sees, so eval pairs are new pairs of users and items that training has
seen (drawn from the same ids).
"""
import ml_collections
import numpy as np

_TASTE_DIMS = 8


def build(data_config: ml_collections.ConfigDict, seed: int):
  """((train ids, clicks), (eval ids, clicks)): the registry's numpy split form."""
  rng = np.random.default_rng([seed, 0])
  users = rng.normal(size=(data_config.num_users, _TASTE_DIMS)).astype(np.float32)
  items = rng.normal(size=(data_config.num_items, _TASTE_DIMS)).astype(np.float32)
  train = _sample(users, items, data_config.num_train_examples, np.random.default_rng([seed, 1]))
  test = _sample(users, items, data_config.num_eval_examples, np.random.default_rng([seed, 2]))
  return train, test


def _sample(users: np.ndarray, items: np.ndarray, n: int, rng: np.random.Generator):
  user_ids = rng.integers(0, len(users), size=n)
  item_ids = rng.integers(0, len(items), size=n)
  clicks = (np.einsum("nd,nd->n", users[user_ids], items[item_ids]) > 0).astype(np.int64)
  return np.stack([user_ids, item_ids], axis=1).astype(np.int32), clicks
