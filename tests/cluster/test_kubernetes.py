"""deploy/kubernetes/: the manifests, rendered, against the Kubernetes API's schema (the
official Python client's models, with no field silently dropped), their exit-code
mapping against distloop's table, and the TF_CONFIG each pod builds against what
distloop's runtime reads (trainer/cluster/kubernetes.py, runtime.cluster_resolver)."""
import copy
import importlib.util
import json
import os

import pytest
import yaml

from tests.support.cli import REPO
from trainer.cluster import kubernetes as k8s_env
from trainer.errors import EXIT_BAD_INPUT, EXIT_PREEMPTED, UserError

k8s = pytest.importorskip(
    "kubernetes", reason="the official Kubernetes client validates the manifests: "
                         "pip install -e '.[test]' installs it")

_DIR = os.path.join(REPO, "deploy", "kubernetes")
_spec = importlib.util.spec_from_file_location("render", os.path.join(_DIR, "render.py"))
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

_VALUES = {"NAME": "run1", "IMAGE": "registry.example/distloop:1", "CLAIM": "shared-runs"}
# JobSet v1alpha2's fields (sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go): a CRD,
# not in the client; its embedded Job template is checked as a V1JobTemplateSpec.
_JOBSET_FIELDS = {
    "spec": {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy",
             "suspend", "coordinator", "managedBy", "ttlSecondsAfterFinished"},
    "network": {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"},
    "failurePolicy": {"maxRestarts", "restartStrategy", "rules"},
    "rule": {"name", "action", "onJobFailureReasons", "targetReplicatedJobs"},
    "replicatedJob": {"name", "groupName", "template", "replicas", "dependsOn"},
}
_JOBSET_ACTIONS = {"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"}


def _docs(name: str, **values) -> list[dict]:
  return list(yaml.safe_load_all(render.render(os.path.join(_DIR, name),
                                               **{**_VALUES, **values})))


def _first_difference(expected, actual, path="") -> str | None:
  """Where the client's round trip of the manifest lost or changed something."""
  if isinstance(expected, dict) and isinstance(actual, dict):
    for key in expected:
      if key not in actual:
        return f"{path}.{key}: not a field of the API (dropped by the client)"
      difference = _first_difference(expected[key], actual[key], f"{path}.{key}")
      if difference:
        return difference
    extra = set(actual) - set(expected)
    return f"{path}: gained {sorted(extra)}" if extra else None
  if isinstance(expected, list) and isinstance(actual, list):
    if len(expected) != len(actual):
      return f"{path}: {len(expected)} items became {len(actual)}"
    for i, (a, b) in enumerate(zip(expected, actual)):
      difference = _first_difference(a, b, f"{path}[{i}]")
      if difference:
        return difference
    return None
  return None if expected == actual else f"{path}: {expected!r} became {actual!r}"


def validate(document: dict, model: str) -> None:
  """AssertionError unless `document` deserializes into the client's `model` (required
  fields, types, enums) and serializes back to itself: the client ignores unknown keys,
  so a typo such as `podFailurPolicy` would otherwise pass."""
  client = k8s.client.ApiClient()
  try:
    obj = client._ApiClient__deserialize(copy.deepcopy(document), model)  # pylint: disable=protected-access
  except (ValueError, TypeError) as e:
    raise AssertionError(f"not a valid {model}: {e}") from None
  difference = _first_difference(document, client.sanitize_for_serialization(obj))
  assert difference is None, f"{model}{difference}"


def validate_jobset(document: dict) -> None:
  assert document["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and document["kind"] == "JobSet"
  validate(document["metadata"], "V1ObjectMeta")
  spec = document["spec"]
  assert set(spec) <= _JOBSET_FIELDS["spec"], set(spec) - _JOBSET_FIELDS["spec"]
  assert set(spec["network"]) <= _JOBSET_FIELDS["network"]
  assert set(spec["failurePolicy"]) <= _JOBSET_FIELDS["failurePolicy"]
  for rule in spec["failurePolicy"].get("rules", []):
    assert set(rule) <= _JOBSET_FIELDS["rule"] and rule["action"] in _JOBSET_ACTIONS, rule
  for job in spec["replicatedJobs"]:
    assert set(job) <= _JOBSET_FIELDS["replicatedJob"], set(job) - _JOBSET_FIELDS["replicatedJob"]
    validate(job["template"], "V1JobTemplateSpec")


def _service_and_job(**values) -> tuple[dict, dict]:
  service, job = _docs("job.yaml", **values)
  assert (service["kind"], job["kind"]) == ("Service", "Job")
  return service, job


def test_job_and_service_validate_against_the_api_schema():
  service, job = _service_and_job()
  validate(service, "V1Service")
  validate(job, "V1Job")


def test_jobset_validates_its_fields_and_its_job_template():
  (jobset,) = _docs("jobset.yaml")
  validate_jobset(jobset)


@pytest.mark.parametrize("mutate, expected", [
    (lambda job: job["spec"].__setitem__("podFailurPolicy", job["spec"].pop("podFailurePolicy")),
     "podFailurPolicy"),
    (lambda job: job["spec"]["template"]["spec"]["containers"][0].__setitem__("envv", []),
     "envv"),
    (lambda job: job["spec"]["podFailurePolicy"]["rules"][0].pop("action"), "action"),
], ids=["misspelt field", "misspelt nested field", "missing required field"])
def test_validation_catches_a_broken_manifest(mutate, expected):
  """Catches a validator that trusts the client alone: it drops unknown keys silently."""
  _, job = _service_and_job()
  mutate(job)
  with pytest.raises(AssertionError, match=expected):
    validate(job, "V1Job")


def test_validation_catches_a_misspelt_jobset_field():
  (jobset,) = _docs("jobset.yaml")
  jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMod"] = "Indexed"
  with pytest.raises(AssertionError, match="completionMod"):
    validate_jobset(jobset)


def _rules(job_spec: dict) -> dict:
  """{exit code or pod condition: action}."""
  rules = {}
  for rule in job_spec["podFailurePolicy"]["rules"]:
    if "onExitCodes" in rule:
      assert rule["onExitCodes"]["operator"] == "In"
      assert rule["onExitCodes"]["containerName"] == "trainer"
      rules.update({code: rule["action"] for code in rule["onExitCodes"]["values"]})
    for condition in rule.get("onPodConditions", []):
      rules[condition["type"]] = rule["action"]
  return rules


def _job_specs() -> list[tuple[str, dict]]:
  _, job = _service_and_job(PREEMPTED_EXIT_CODE="143")
  (jobset,) = _docs("jobset.yaml", PREEMPTED_EXIT_CODE="143")
  return [("job", job["spec"]), ("jobset", jobset["spec"]["replicatedJobs"][0]["template"]["spec"])]


@pytest.mark.parametrize("which", ["job", "jobset"])
def test_exit_codes_map_to_the_failure_policy(which):
  """Catches a manifest whose Ignore code is not the one the trainer exits with (a
  preemption then counts as a failure), or that retries bad input."""
  spec = dict(_job_specs())[which]
  assert _rules(spec) == {EXIT_BAD_INPUT: "FailJob", 143: "Ignore", "DisruptionTarget": "Ignore"}
  pod = spec["template"]["spec"]
  assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
  (container,) = pod["containers"]
  assert "--preempted_exit_code=143" in container["args"]
  _, default = _service_and_job()
  assert _rules(default["spec"])[EXIT_PREEMPTED] == "Ignore"
  assert f"--preempted_exit_code={EXIT_PREEMPTED}" in (
      default["spec"]["template"]["spec"]["containers"][0]["args"])


@pytest.mark.parametrize("which", ["job", "jobset"])
def test_model_dir_is_on_the_shared_claim(which):
  spec = dict(_job_specs())[which]
  pod = spec["template"]["spec"]
  (container,) = pod["containers"]
  model_dir = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--model_dir="))
  (mount,) = container["volumeMounts"]
  assert model_dir.startswith(mount["mountPath"] + "/")
  (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
  assert volume["persistentVolumeClaim"]["claimName"] == _VALUES["CLAIM"]


def _pod_env(container: dict, index: int) -> dict:
  """The pod's environment: the manifest's, plus the index the Job controller adds."""
  env = {item["name"]: item["value"] for item in container["env"]}
  return {**env, "JOB_COMPLETION_INDEX": str(index)}


def _tf_configs(container: dict, workers: int) -> list[dict]:
  return [k8s_env.tf_config(_pod_env(container, i)) for i in range(workers)]


def _assert_cluster(configs: list[dict], hosts: list[str]) -> None:
  for index, config in enumerate(configs):
    assert config == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}


def test_each_job_pod_gets_the_cluster_of_the_headless_service():
  """Catches hosts that do not resolve: the pods' names are <job>-<index>.<subdomain>,
  the subdomain must be the headless Service that selects the Job's pods, on the port
  the trainer listens on."""
  service, job = _service_and_job(NUM_WORKERS="3")
  pod = job["spec"]["template"]["spec"]
  assert job["spec"]["completionMode"] == "Indexed"
  assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
  assert service["spec"]["clusterIP"] == "None"
  assert pod["subdomain"] == service["metadata"]["name"]
  assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
  (container,) = pod["containers"]
  (port,) = service["spec"]["ports"]
  assert [p["containerPort"] for p in container["ports"]] == [port["port"]]
  name, subdomain = job["metadata"]["name"], pod["subdomain"]
  _assert_cluster(_tf_configs(container, 3),
                  [f"{name}-{i}.{subdomain}:{port['port']}" for i in range(3)])


def test_each_jobset_pod_gets_the_cluster_of_its_subdomain():
  (jobset,) = _docs("jobset.yaml", NUM_WORKERS="4")
  spec = jobset["spec"]
  (replicated,) = spec["replicatedJobs"]
  assert replicated["replicas"] == 1  # one Job: its pod index is the worker index
  job = replicated["template"]["spec"]
  assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == 4
  assert spec["network"]["enableDNSHostnames"] is True
  (container,) = job["template"]["spec"]["containers"]
  (port,) = container["ports"]
  prefix = f"{jobset['metadata']['name']}-{replicated['name']}-0"
  _assert_cluster(_tf_configs(container, 4),
                  [f"{prefix}-{i}.{spec['network']['subdomain']}:{port['containerPort']}"
                   for i in range(4)])


def test_runtime_reads_the_tf_config_a_pod_builds(monkeypatch):
  """Catches a TF_CONFIG distloop's own reader does not take (or never builds: the
  resolver would then be None, a single process). In a run's order: api's checks read
  TF_CONFIG's task first (and build a pod's), the strategy's resolver after them."""
  import configs  # pylint: disable=g-import-not-at-top
  from trainer import api  # pylint: disable=g-import-not-at-top
  from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top  (TensorFlow)
  _, job = _service_and_job(NUM_WORKERS="2")
  (container,) = job["spec"]["template"]["spec"]["containers"]
  monkeypatch.setenv("TF_CONFIG", "")  # recorded, so the TF_CONFIG built below is undone
  monkeypatch.delenv("TF_CONFIG")     # (a later test in this process would see a cluster)
  for key, value in _pod_env(container, 1).items():
    monkeypatch.setenv(key, value)
  assert not api.is_evaluator_task()
  resolver = runtime.cluster_resolver(configs.get("synthetic").runtime)
  assert resolver.cluster_spec().as_dict() == {"worker": ["run1-0.run1:2222", "run1-1.run1:2222"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)
  assert json.loads(os.environ["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


def test_tf_config_set_by_the_user_wins():
  environ = {"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}}', "DISTLOOP_WORKER_HOSTS": "b:2",
             "JOB_COMPLETION_INDEX": "0"}
  assert not k8s_env.export_tf_config(environ)
  assert environ["TF_CONFIG"] == '{"cluster": {"worker": ["a:1"]}}'
  assert not k8s_env.export_tf_config({})  # nothing said: a single process


def test_a_list_of_hosts_is_taken_as_is():
  assert k8s_env.tf_config({"DISTLOOP_WORKER_HOSTS": "a:1, b:2", "JOB_COMPLETION_INDEX": "1"}) == {
      "cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("environ, expected", [
    ({"DISTLOOP_WORKER_HOSTS": "w-{index}.s:2222"}, "DISTLOOP_NUM_WORKERS"),
    ({"DISTLOOP_WORKER_HOSTS": "w-{index}.s:2222", "DISTLOOP_NUM_WORKERS": "2"},
     "JOB_COMPLETION_INDEX=(unset)"),
    ({"DISTLOOP_WORKER_HOSTS": "w-{index}.s:2222", "DISTLOOP_NUM_WORKERS": "2",
      "JOB_COMPLETION_INDEX": "2"}, "0..1"),
    ({"DISTLOOP_WORKER_HOSTS": "w.s:2222,w.s:2222", "JOB_COMPLETION_INDEX": "0"},
     "not distinct"),
    ({"DISTLOOP_WORKER_HOSTS": "w-{index}.s", "DISTLOOP_NUM_WORKERS": "2",
      "JOB_COMPLETION_INDEX": "0"}, "host:port"),
    ({"DISTLOOP_WORKER_HOSTS": "a:1,b:2", "DISTLOOP_NUM_WORKERS": "3",
      "JOB_COMPLETION_INDEX": "0"}, "lists 2 workers"),
], ids=["pattern without a count", "no index", "index out of range", "one host for two",
        "no port", "count disagrees"])
def test_an_inconsistent_environment_is_one_line(environ, expected):
  """Catches a pod that would join a cluster of the wrong shape (or as the wrong worker)."""
  with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")) as e:
    k8s_env.tf_config(environ)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("values, expected", [
    ({"NAME": ""}, "missing NAME"),
    ({"NAME": "Run_1"}, "NAME=Run_1"),
    ({"PREEMPTED_EXIT_CODE": "2"}, "PREEMPTED_EXIT_CODE=2"),
    ({"NUM_WORKERS": "0"}, "NUM_WORKERS=0"),
])
def test_render_refuses_bad_values(values, expected):
  with pytest.raises(render.RenderError, match=expected):
    render.render(os.path.join(_DIR, "job.yaml"), **{**_VALUES, **values})


_BUCKET_VALUES = {"NAME": "run1", "IMAGE": "registry.example/distloop:1",
                  "MODEL_DIR": "gs://my-bucket/runs"}


def test_the_bucket_job_needs_no_volume_and_validates():
  """Catches the bucket variant still mounting a PersistentVolumeClaim (a pod that cannot
  start without one), a model_dir that is not the bucket's, and a manifest the API
  server would refuse."""
  service, job = yaml.safe_load_all(render.render(os.path.join(_DIR, "job-bucket.yaml"),
                                                  **_BUCKET_VALUES))
  validate(service, "V1Service")
  validate(job, "V1Job")
  pod = job["spec"]["template"]["spec"]
  (container,) = pod["containers"]
  assert "volumes" not in pod and "volumeMounts" not in container
  assert "--model_dir=gs://my-bucket/runs/run1" in container["args"]
  assert pod["serviceAccountName"] == "default"
  # The same failure policy and cluster as job.yaml's: only the storage differs.
  _, plain = _service_and_job()
  assert job["spec"]["podFailurePolicy"] == plain["spec"]["podFailurePolicy"]
  assert container["env"] == plain["spec"]["template"]["spec"]["containers"][0]["env"]


@pytest.mark.parametrize("values, expected", [
    ({"MODEL_DIR": ""}, "missing MODEL_DIR"),
    ({"MODEL_DIR": "/mnt/runs"}, "MODEL_DIR=/mnt/runs: a bucket folder"),
    ({"MODEL_DIR": "hdfs://nn/runs"}, "MODEL_DIR=hdfs://nn/runs"),
])
def test_render_refuses_a_bucket_job_without_a_bucket(values, expected):
  with pytest.raises(render.RenderError, match=expected):
    render.render(os.path.join(_DIR, "job-bucket.yaml"), **{**_BUCKET_VALUES, **values})
