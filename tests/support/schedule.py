"""The order pytest-xdist's workers take the units of work in: longest first.

A unit (an xdist group: a test file, or a cell of the guarantee matrix) runs whole on one
worker. pytest-xdist orders units by their number of tests, so a file of two long tests
(Ray, a parameter-server cluster) came last and ran alone on one core while the other idled.
Taking the longest first (a greedy schedule that ends with the short units) keeps both
workers busy to the end. The lengths are seconds measured in a CI run (durations.json);
a unit not measured yet counts as the median. A stale figure costs minutes, never a result.

Refresh after a run of `python -m pytest -m "slow or not slow" --durations=0 > LOG`:
`python -m tests.support.schedule LOG` rewrites durations.json.
"""
import collections
import json
import os
import re
import statistics
import sys

DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def measured() -> dict[str, float]:
  try:
    with open(DURATIONS) as f:
      return json.load(f)
  except FileNotFoundError:
    return {}


def longest_first(items, group_of) -> list:
  """`items` stably sorted by their unit's measured seconds, longest first."""
  seconds = measured()
  default = statistics.median(seconds.values()) if seconds else 0.0
  return sorted(items, key=lambda item: -seconds.get(group_of(item), default))


def from_log(path: str) -> dict[str, float]:
  """{group: seconds} from pytest's `--durations=0` lines ("1.2s call  NODEID@GROUP")."""
  totals = collections.defaultdict(float)
  with open(path) as f:
    for line in f:
      found = re.match(r"([0-9.]+)s (?:setup|call|teardown)\s+.*@(\S+)\s*$", line)
      if found:
        totals[found.group(2)] += float(found.group(1))
  return {group: round(total, 1) for group, total in sorted(totals.items())}


if __name__ == "__main__":
  found = from_log(sys.argv[1])
  with open(DURATIONS, "w") as f:
    json.dump(found, f, indent=0, sort_keys=True)
    f.write("\n")
  print(f"{len(found)} units, {sum(found.values()):.0f} s in all -> {DURATIONS}")
