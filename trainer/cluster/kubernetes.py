"""TF_CONFIG from a Kubernetes Indexed Job's environment (deploy/kubernetes/).

An Indexed Job (or a JobSet's) gives each pod JOB_COMPLETION_INDEX (0..N-1) and, with
a headless Service as its subdomain, a stable host name per index. The manifests set

    DISTLOOP_WORKER_HOSTS   the workers' host:port, one per index: a pattern with
                            {index} (e.g. `run1-{index}.run1:2222`) and
                            DISTLOOP_NUM_WORKERS=N, or a comma-separated list

and `tf_config()` turns that and JOB_COMPLETION_INDEX into the standard TF_CONFIG
(every worker the same cluster, this pod the worker of its index; worker 0 the chief).
Built here rather than in a shell line of the manifest, so that a test checks what
each pod of a rendered manifest gets. A TF_CONFIG already set wins. No TensorFlow.
"""
import json
import os

from trainer.errors import UserError

HOSTS = "DISTLOOP_WORKER_HOSTS"
NUM_WORKERS = "DISTLOOP_NUM_WORKERS"
INDEX = "JOB_COMPLETION_INDEX"


def tf_config(environ=None) -> dict | None:
  """The TF_CONFIG dict the environment describes, or None when it describes none
  (no DISTLOOP_WORKER_HOSTS). UserError, in one line, for an inconsistent one."""
  environ = os.environ if environ is None else environ
  hosts = environ.get(HOSTS, "").strip()
  if not hosts:
    return None
  if "{index}" in hosts:
    count = environ.get(NUM_WORKERS, "").strip()
    if not count.isdigit() or int(count) < 1:
      raise UserError(f"{HOSTS}={hosts} is a pattern: it needs {NUM_WORKERS}=N (N >= 1), "
                      f"not {count or 'nothing'}")
    workers = [hosts.replace("{index}", str(i)) for i in range(int(count))]
  else:
    workers = [host.strip() for host in hosts.split(",") if host.strip()]
    if environ.get(NUM_WORKERS, "").strip() not in ("", str(len(workers))):
      raise UserError(f"{HOSTS} lists {len(workers)} workers but {NUM_WORKERS}="
                      f"{environ[NUM_WORKERS]}")
  bad = [host for host in workers
         if not host.rpartition(":")[0] or not host.rpartition(":")[2].isdigit()]
  if bad:
    raise UserError(f"{HOSTS}: {bad[0]!r} is not host:port")
  if len(set(workers)) != len(workers):
    raise UserError(f"{HOSTS}: the workers' addresses are not distinct ({', '.join(workers)})")
  index = environ.get(INDEX, "").strip()
  if not index.isdigit() or int(index) >= len(workers):
    raise UserError(f"{HOSTS} is set but {INDEX}={index or '(unset)'} is not a worker index "
                    f"0..{len(workers) - 1} (an Indexed Job sets it: completionMode: Indexed)")
  return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(index)}}


def export_tf_config(environ=None) -> bool:
  """Sets TF_CONFIG from `tf_config()` unless TF_CONFIG is already set; True if it did."""
  environ = os.environ if environ is None else environ
  if environ.get("TF_CONFIG"):
    return False
  config = tf_config(environ)
  if config is None:
    return False
  environ["TF_CONFIG"] = json.dumps(config)
  return True
