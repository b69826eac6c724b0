"""distloop vs Keras `fit`, a bare loop and orbit, here: `python -m benchmarks.throughput`.

Answers "what does the readable loop cost?": steady-state training examples/s of
(a) the distloop CLI, (b) Keras `model.fit` at its best setting and (c) a bare
minimal loop (the ceiling) and (c') the same loop with the whole step under XLA
(the accelerator ceiling; one replica), and (o) TF Model Garden's orbit (its
`Controller` and a `StandardTrainer` with the custom-training-loop tutorial's step
in orbit's `tf.while_loop`: the loop users would pick instead; it runs in its own
environment, made by benchmarks/orbit_env.sh, since orbit and tf-keras are no
distloop dependencies), all on the same model (the seed CNN, or
`--model=mlp --mlp_units=8` for per-step overhead), Adam(1e-3), global batch,
strategy and synthetic data, at each --batches x --replicas. Also: (d) what
distloop's input pipeline delivers alone, (e) what an async checkpoint every
100 steps costs, (f) the peak RSS of every run. Prints a markdown report (and
writes it to --output).

How it stays fair:
- Every measurement is its own fresh process, and distloop / fit / bare / orbit
  alternate (A/B/C/D/A/B/C/D...; --peers picks which run), so a drift of the
  machine hits all alike; tables show the median of --repeats, with the range
  (ratios: the median ones' ratio, with the range of the rounds' paired ratios).
- Steady state for all. distloop: the wall clock between its first and
  last loop boundary (the time stamps of the progress lines it logs at every
  boundary), so the first, tracing loop is left out but all
  the work between loops (metrics read, logs, summaries, checkpoints) is in.
  summary.json's `examples_per_sec` times only the compiled loops; it is shown
  beside it. fit: the same window, from its first to its last execution's end
  (a callback); bare: marginal throughput between runs of S/4 and S steps after
  a warm-up (benchmarks/runners.py); orbit: the same, each run one
  `Controller.train` call.
- The same CPU kernels (--cpu_kernels: oneDNN, which distloop turns on, or
  Eigen) for distloop, both bare loops and orbit; with several replicas, the
  same threads per op for all (distloop's runtime.configure: cores / replicas).
- fit's best setting is found first, one process per `steps_per_execution` in
  {1, L} x `jit_compile` in {False, True} with those kernels, and {1, L} without
  XLA with the other ones (TensorFlow's own default on an AVX2 CPU is Eigen);
  the A/B/C rounds use the winner.
- Peak RSS comes from the kernel: `os.wait4` returns the resource usage of that
  one child (RUSAGE_CHILDREN would be the maximum over all children so far).

Keep the machine quiet while it runs: the report says how much CPU other
processes took meanwhile, so a noisy run shows.
"""
import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

BATCHES = flags.DEFINE_list("batches", ["32", "256"], "global batch sizes")
REPLICAS = flags.DEFINE_list("replicas", ["1", "2"],
                              "replica counts: 1 = default strategy, N = mirrored on N "
                              "logical CPU devices")
REPEATS = flags.DEFINE_integer("repeats", 3, "fresh-process repeats of every measurement")
_STEPS = flags.DEFINE_integer("steps", 1000,
                              "training steps of a run at batch 32 (~8 s on a 2-core CPU); at "
                              "batch B, steps * sqrt(32 / B) in whole loops, so every run "
                              "takes about as long")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 50,
                                       "distloop train.steps_per_loop, bare's loop, fit's "
                                       "larger steps_per_execution")
_CHECKPOINT_INTERVAL = flags.DEFINE_integer("checkpoint_interval", 100,
                                            "(e): steps between checkpoints of the run "
                                            "compared with one that saves only at the end")
_OUTPUT = flags.DEFINE_string("output", "", "also write the report to this file")
_MODEL = flags.DEFINE_enum("model", "mnist_cnn", ["mnist_cnn", "mlp"], "the model of every run")
_MLP_UNITS = flags.DEFINE_integer("mlp_units", 128, "--model=mlp: hidden units (8: a step "
                                  "that is nearly all op dispatch, as on a GPU)")
_CPU_KERNELS = flags.DEFINE_enum("cpu_kernels", "onednn", ["onednn", "eigen"],
                                 "TensorFlow's CPU kernels for distloop and the bare loops "
                                 "(TF_ENABLE_ONEDNN_OPTS=1 or 0)")
_FIT_SETTINGS = flags.DEFINE_list("fit_settings", [],
                                  "fit settings to try, as STEPS_PER_EXECUTION:jit|nojit"
                                  "[:onednn|eigen] (kernels default to --cpu_kernels; default "
                                  "list: {1, steps_per_loop} x {jit, nojit}, and {1, "
                                  "steps_per_loop} without jit on the other kernels)")
_CHECKPOINT_COST = flags.DEFINE_bool("checkpoint_cost", True, "measure (e)")
_PIPELINE = flags.DEFINE_bool("pipeline", True, "measure (d)")
_QUICK = flags.DEFINE_bool("quick", False,
                           "a smoke test: 1 repeat, 200 steps, fit's and the checkpoint "
                           "baseline's runs reused; its numbers are noise")

_PEERS = flags.DEFINE_list("peers", ["fit", "bare", "orbit"],
                           "what distloop is compared with: fit (Keras model.fit at its best "
                           "setting), bare (the bare loops), orbit (TF Model Garden's; left "
                           "out with a note when its environment is missing)")
_ORBIT_PYTHON = flags.DEFINE_string("orbit_python", "",
                                    "the interpreter of orbit's environment (default: the one "
                                    "benchmarks/orbit_env.sh makes, under "
                                    "~/.cache/distloop-bench/orbit-venv)")
_QUICK_STEPS = 200


# -- running one child --------------------------------------------------------


def _onednn_env(kernels: str) -> str:
  return "1" if kernels == "onednn" else "0"


def run_child(command: list[str], kernels: str) -> tuple[str, str, int, float]:
  """(stdout, stderr, exit code, peak RSS in MB) of `command`, run to its end with
  `kernels` ("onednn" or "eigen") as TensorFlow's CPU kernels."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS=_onednn_env(kernels))
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
    # wait4, not wait: the rusage of this child alone (ru_maxrss is in KiB on Linux).
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    return (out.read().decode(errors="replace"), err.read().decode(errors="replace"),
            process.returncode, usage.ru_maxrss / 1024)


def failure(command: list[str], code: int, stderr: str) -> SystemExit:
  tail = "\n".join(stderr.splitlines()[-20:])
  return SystemExit(f"{' '.join(command)}\nexited {code}:\n{tail}")


def _runner(name: str, batch: int, replicas: int, steps: int, *extra: str,
            may_fail: bool = False, kernels: str = "", python: str = "") -> dict:
  """One measurement of benchmarks/runners.py (fit, bare, orbit, pipeline) in a fresh
  process, run by `python` (default: this interpreter)."""
  command = [python or sys.executable, "-m", "benchmarks.runners", f"--runner={name}",
             f"--batch={batch}", f"--replicas={replicas}", f"--steps={steps}",
             f"--steps_per_loop={_STEPS_PER_LOOP.value}", f"--model={_MODEL.value}",
             f"--mlp_units={_MLP_UNITS.value}", *extra]
  stdout, stderr, code, peak_rss_mb = run_child(command, kernels or _CPU_KERNELS.value)
  for line in reversed(stdout.splitlines()):
    if line.startswith("RESULT ") and code == 0:
      return {**json.loads(line[len("RESULT "):]), "peak_rss_mb": peak_rss_mb}
    if line.startswith("ERROR ") and may_fail:
      return {"error": line[len("ERROR "):]}
  raise failure(command, code, stderr)


def distloop(batch: int, replicas: int, steps: int, checkpoint_interval: int = 0,
              workers: int = 1, extra_flags: tuple = ()) -> dict:
  """One run of the distloop CLI, exactly as a user types it, in a fresh model_dir; with
  `workers` > 1, `python -m trainer.launch --num_workers=N` on a private loopback network
  (`replicas` per worker process, 1 on a CPU)."""
  with tempfile.TemporaryDirectory(prefix="distloop_throughput_") as model_dir:
    trainer_flags = [
        "--config=synthetic", f"--model_dir={model_dir}",
        f"--config.train.steps={steps}", f"--config.train.global_batch_size={batch}",
        f"--config.train.steps_per_loop={_STEPS_PER_LOOP.value}",
        f"--config.checkpoint.interval={checkpoint_interval or steps}",
        f"--config.model.name={_MODEL.value}", f"--config.model.mlp_units={_MLP_UNITS.value}",
        *extra_flags]
    if workers == 1:
      command = [sys.executable, "-m", "trainer", *trainer_flags,
                 f"--config.runtime.strategy={'default' if replicas == 1 else 'mirrored'}",
                 f"--config.runtime.num_cpu_devices={replicas}"]
    else:  # the launcher adds runtime.strategy; TF's servers listen on 0.0.0.0: no network
      command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
                 sys.executable, "-m", "trainer.launch", f"--num_workers={workers}", "--",
                 *trainer_flags, f"--config.runtime.num_cpu_devices={replicas}"]
    _, stderr, code, peak_rss_mb = run_child(command, _CPU_KERNELS.value)
    if code != 0:
      raise failure(command, code, stderr)
    with open(os.path.join(model_dir, "summary.json")) as f:
      summary = json.load(f)
    boundaries = loop_boundaries(stderr)
  (first_step, first_time), (last_step, last_time) = boundaries[0], boundaries[-1]
  if last_step <= first_step:
    raise SystemExit(f"{steps} steps make a single loop of {_STEPS_PER_LOOP.value}: "
                     "nothing is left after the first, tracing loop; use more --steps")
  return {"examples_per_sec": (last_step - first_step) * batch / (last_time - first_time),
          "summary_examples_per_sec": summary["examples_per_sec"],
          "checkpoint_time_sec": summary["checkpoint_time_sec"],
          "loop_seconds": {step: now - then for (_, then), (step, now)
                           in zip(boundaries, boundaries[1:])},
          "peak_rss_mb": peak_rss_mb}


def loop_boundaries(stderr: str, at_least: int = 2) -> list[tuple[int, float]]:
  """(step, unix time) of every loop boundary: the time stamps of the progress lines
  (`step N/TOTAL | ...`, one INFO line per boundary when stderr is not a terminal), logged
  right after the boundary's host sync. (TensorBoard's event times are the times its
  scalars were written: kept and written together, once a second at most.)"""
  year = datetime.datetime.now().year
  points = []
  for month_day, clock, step in _PROGRESS_LINE.findall(stderr):
    when = datetime.datetime.strptime(f"{year}{month_day} {clock}", "%Y%m%d %H:%M:%S.%f")
    points.append((int(step), when.timestamp()))
  if len(points) < at_least:
    raise SystemExit(f"fewer than {at_least} loop boundaries logged; use more --steps")
  return points


_PROGRESS_LINE = re.compile(r"^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*progress\.py:\d+\] step (\d+)/",
                            re.M)


# -- orbit's environment -------------------------------------------------------


def _orbit_python() -> str:
  """The interpreter that runs orbit: --orbit_python, else benchmarks/orbit_env.sh's venv."""
  if _ORBIT_PYTHON.value:
    return _ORBIT_PYTHON.value
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "distloop-bench", "orbit-venv", "bin", "python")


def _peers() -> tuple[list[str], str | None]:
  """(the peers to run, in --peers order, why orbit was left out or None): orbit needs
  its own interpreter."""
  peers = list(dict.fromkeys(_PEERS.value))
  for name in peers:
    if name not in _PEER_COLUMNS:
      raise app.UsageError(f"--peers: {name!r} is not one of {', '.join(_PEER_COLUMNS)}")
  if "orbit" in peers and not os.access(_orbit_python(), os.X_OK):
    peers.remove("orbit")
    return peers, (f"orbit was left out: no interpreter at {_orbit_python()}. Create its "
                   "environment with `sh benchmarks/orbit_env.sh` (a venv with "
                   "tf-models-official and tf-keras over this TensorFlow), or pass "
                   "--orbit_python=PATH.")
  return peers, None


# -- the plan ----------------------------------------------------------------


def steps_of(batch: int) -> int:
  """Steps of a run at `batch`: about as long as --steps at batch 32, whole loops."""
  loop = _STEPS_PER_LOOP.value
  base = _QUICK_STEPS if _QUICK.value else _STEPS.value
  scaled = int(base * math.sqrt(32 / batch)) // loop * loop
  return max(scaled, 4 * loop)


def _sweep_steps(batch: int) -> int:
  """fit's settings are compared on shorter runs, but never under four loops."""
  return max(steps_of(batch) // 2 // _STEPS_PER_LOOP.value * _STEPS_PER_LOOP.value,
             4 * _STEPS_PER_LOOP.value)


def _fit_settings() -> list[tuple[int, bool, str]]:
  """(steps_per_execution, jit_compile, CPU kernels) of every fit setting to try."""
  if _FIT_SETTINGS.value:
    return [(int(spec.split(":")[0]), spec.split(":")[1] == "jit",
             (spec.split(":") + [_CPU_KERNELS.value])[2]) for spec in _FIT_SETTINGS.value]
  other = "eigen" if _CPU_KERNELS.value == "onednn" else "onednn"
  loops = (1, _STEPS_PER_LOOP.value)
  return ([(spe, jit, _CPU_KERNELS.value) for spe in loops for jit in (False, True)]
          + [(spe, False, other) for spe in loops])


def _fit_flags(setting: tuple[int, bool, str]) -> list[str]:
  steps_per_execution, jit_compile, _ = setting
  return [f"--steps_per_execution={steps_per_execution}",
          "--jit_compile" if jit_compile else "--nojit_compile"]


def _describe(setting: tuple[int, bool, str]) -> str:
  kernels = {"onednn": "oneDNN", "eigen": "Eigen"}[setting[2]]
  return f"steps_per_execution={setting[0]}, jit_compile={setting[1]}, {kernels}"


def _progress(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _median(runs: list[dict], key: str = "examples_per_sec") -> float:
  return statistics.median(run[key] for run in runs)


def _spread(runs: list[dict], key: str = "examples_per_sec") -> str:
  """The median of `key` and its range, as "median (min-max)"; one run: its value."""
  values = [run[key] for run in runs]
  if len(values) == 1:
    return f"{values[0]:.0f}"
  return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def _measure_training(batch: int, replicas: int, repeats: int, peers: list[str]) -> dict:
  """fit's settings, then `repeats` rounds of distloop and the `peers` (fit, bare, orbit)."""
  steps = steps_of(batch)
  settings, best = {}, None
  for setting in _fit_settings() if "fit" in peers else []:  # one process each: a failure
    # must not poison the next
    settings[setting] = _runner("fit", batch, replicas, _sweep_steps(batch), *_fit_flags(setting),
                                may_fail=True, kernels=setting[2])
    rate = settings[setting].get("examples_per_sec")
    _progress(f"  batch {batch}, {replicas} replica(s), fit {_describe(setting)}: "
              + (f"{rate:.0f} ex/s" if rate else f"failed ({settings[setting]['error']})"))
  working = {s: r for s, r in settings.items() if "error" not in r}
  if "fit" in peers and not working:
    raise SystemExit(f"fit failed in every setting at batch {batch}, {replicas} replica(s)")
  if working:
    best = max(working, key=lambda s: working[s]["examples_per_sec"])

  runs = {"distloop": [], "fit": [], "bare": [], "bare_xla": [], "orbit": []}
  for repeat in range(repeats):
    runs["distloop"].append(distloop(batch, replicas, steps))
    if "fit" not in peers:
      pass
    elif repeat == 0 and (_QUICK.value or len(_fit_settings()) == 1):  # the one setting's run
      runs["fit"].append(working[best])
    else:
      runs["fit"].append(_runner("fit", batch, replicas, steps, *_fit_flags(best),
                                 kernels=best[2]))
    if "bare" in peers:
      runs["bare"].append(_runner("bare", batch, replicas, steps))
      if replicas == 1:
        runs["bare_xla"].append(_runner("bare_xla", batch, replicas, steps))
    if "orbit" in peers:
      runs["orbit"].append(_runner("orbit", batch, replicas, steps, python=_orbit_python()))
    ran = [name for name in runs if runs[name]]
    _progress(f"  batch {batch}, {replicas} replica(s), {steps} steps: " + " / ".join(ran)
              + " = " + " / ".join(f"{runs[name][-1]['examples_per_sec']:.0f}" for name in ran)
              + " ex/s" + (f"; orbit's loss {runs['orbit'][-1]['first_loop_loss']:.3f} (first "
                           f"loop) -> {runs['orbit'][-1]['last_loop_loss']:.3f} (last)"
                           if runs["orbit"] else ""))
  return {"steps": steps, "settings": settings, "best": best, "runs": runs}


def _measure_checkpoint_cost(batch: int, replicas: int, repeats: int,
                             training_runs: list[dict]) -> dict:
  """Alternating runs with a checkpoint every --checkpoint_interval steps and without
  (a smoke test reuses the training runs of that batch for the latter)."""
  steps = steps_of(batch)
  runs = {"with": [], "without": []}
  for i in range(repeats):
    runs["with"].append(distloop(batch, replicas, steps, _CHECKPOINT_INTERVAL.value))
    runs["without"].append(training_runs[i] if _QUICK.value else
                           distloop(batch, replicas, steps))
    _progress(f"  checkpoint every {_CHECKPOINT_INTERVAL.value} / at the end only: "
              f"{runs['with'][-1]['examples_per_sec']:.0f} / "
              f"{runs['without'][-1]['examples_per_sec']:.0f} ex/s")
  return {"steps": steps, "batch": batch, "replicas": replicas, **runs}


# -- the report ----------------------------------------------------------------


def _model_name() -> str:
  return ("seed CNN" if _MODEL.value == "mnist_cnn"
          else f"MLP with {_MLP_UNITS.value} hidden units")


def _machine() -> list[str]:
  cpu = "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  memory = ""
  try:
    with open("/proc/meminfo") as f:
      kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    memory = f", {kib / 2**20:.0f} GiB RAM"
  except (OSError, StopIteration):
    pass

  def version(*packages: str) -> str:
    for package in packages:
      try:
        return importlib.metadata.version(package)
      except importlib.metadata.PackageNotFoundError:
        pass
    return "not installed"

  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return [f"- CPU: {cpu}, {os.cpu_count()} cores ({usable} usable by this process){memory}",
          f"- {platform.system()} {platform.release()}, Python {platform.python_version()}, "
          f"TensorFlow {version('tensorflow', 'tensorflow-cpu')}, Keras {version('keras')}"]


class _ForeignLoad:
  """How much CPU other processes took while the benchmark ran: a noisy run shows.

  The machine's busy time (/proc/stat, steal included) minus this process's and
  its children's own (`os.times`; every child has been waited for), over the
  elapsed time of all cores.
  """

  def __init__(self):
    self._start = self._sample()

  @staticmethod
  def _sample() -> tuple[float, float, float]:
    with open("/proc/stat") as f:
      fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return (time.monotonic(), busy,
            own.user + own.system + own.children_user + own.children_system)

  def share(self) -> float:
    (t0, busy0, own0), (t1, busy1, own1) = self._start, self._sample()
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / ((t1 - t0) * os.cpu_count())


# The peers' columns: (runs key, rate column, ratio column), in the table's order.
_PEER_COLUMNS = {"fit": [("fit", "fit (best setting)", "distloop / fit")],
                 "bare": [("bare", "bare loop", "distloop / bare"),
                          ("bare_xla", "bare loop, whole step XLA", "distloop / bare XLA")],
                 "orbit": [("orbit", "orbit", "distloop / orbit")]}


def _ratio(ours: list[dict], theirs: list[dict]) -> str:
  """distloop's median over the peer's, and the range of the rounds' paired ratios."""
  if not theirs:
    return "-"
  ratios = [a["examples_per_sec"] / b["examples_per_sec"] for a, b in zip(ours, theirs)]
  text = f"{_median(ours) / _median(theirs):.2f}x"
  return text if len(ratios) == 1 else f"{text} ({min(ratios):.2f}-{max(ratios):.2f})"


def _training_section(training: dict, peers: list[str]) -> list[str]:
  columns = [column for peer in peers for column in _PEER_COLUMNS[peer]]
  lines = ["## Training throughput (examples/s)", "",
           "Median of the fresh-process runs (min-max in parentheses; a ratio's range is "
           "that of the rounds' paired ratios).", "",
           "| " + " | ".join(["batch", "replicas", "steps", "distloop", "distloop, summary.json",
                              *(title for _, title, _ in columns),
                              *(ratio for _, _, ratio in columns)]) + " |",
           "| ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (2 * len(columns))]
  for (batch, replicas), result in training.items():
    runs = result["runs"]
    lines.append("| " + " | ".join(
        [str(batch), str(replicas), str(result["steps"]), _spread(runs["distloop"]),
         _spread(runs["distloop"], "summary_examples_per_sec"),
         *(_spread(runs[key]) if runs[key] else "-" for key, _, _ in columns),
         *(_ratio(runs["distloop"], runs[key]) for key, _, _ in columns)]) + " |")
  if "orbit" in peers:
    lines += ["", "orbit's loss, mean over its first and last loop of each run: "
              + "; ".join(f"batch {batch} x {replicas}: "
                          + ", ".join(f"{run['first_loop_loss']:.3f} -> {run['last_loop_loss']:.3f}"
                                      for run in result["runs"]["orbit"])
                          for (batch, replicas), result in training.items()) + "."]
  if "fit" not in peers:
    return lines + [""]
  lines += ["", "### fit's settings", "",
            "One process each (--fit_settings: steps_per_execution, jit_compile, TensorFlow's "
            "CPU kernels), at half the steps (at least 4 loops); the fastest (bold) is the fit "
            "column above.",
            "",
            "| batch | replicas | " + " | ".join(_describe(s) for s in _fit_settings()) + " |",
            "| ---: | ---: |" + " --- |" * len(_fit_settings())]
  failures = {}  # the gist of an error (tensor names left out) -> (note number, its first text)
  for (batch, replicas), result in training.items():
    cells = []
    for setting in _fit_settings():
      outcome = result["settings"][setting]
      if "error" in outcome:
        gist = re.sub(r"'[^']*'", "'...'", outcome["error"])
        note, _ = failures.setdefault(gist, (len(failures) + 1, outcome["error"]))
        cells.append(f"failed [{note}]")
      else:
        cell = f"{outcome['examples_per_sec']:.0f}"
        cells.append(f"**{cell}**" if setting == result["best"] else cell)
    lines.append(f"| {batch} | {replicas} | " + " | ".join(cells) + " |")
  if failures:
    lines += ["", "A setting that fails is left out; the fastest that ran is fit's number.", ""]
    for gist, (note, error) in failures.items():
      lines += [f"- [{note}] `{error}`" + next(
          (f" ({cause})" for marker, cause in _KNOWN_FIT_FAILURES.items() if marker in gist), "")]
  return lines + [""]


# Why fit fails, where the cause is known (TensorFlow 2.21, Keras 3.15).
_KNOWN_FIT_FAILURES = {
    "You must feed a value for placeholder":
        "Keras runs `steps_per_execution` > 1 steps as a `tf.while_loop` with a `tf.cond` "
        "per step, and under MirroredStrategy that graph does not run; the error of "
        "keras-team/keras#19246",
    "Trying to access resource":
        "XLA compiles the replicated step for one device and cannot reach the variable "
        "copies on the others",
}


def _pipeline_section(pipeline: dict, training: dict) -> list[str]:
  lines = ["## Input pipeline alone", "",
           "`batching.train_dataset` through `experimental_distribute_dataset`, drained by a "
           "tf.function that does nothing else, vs what distloop's training consumed.", "",
           "| batch | replicas | pipeline ex/s | distloop training ex/s | pipeline / training |",
           "| ---: | ---: | ---: | ---: | ---: |"]
  for (batch, replicas), runs in pipeline.items():
    delivered = _median(runs)
    consumed = _median(training[batch, replicas]["runs"]["distloop"])
    lines.append(f"| {batch} | {replicas} | {_spread(runs)} | {consumed:.0f} | "
                 f"{delivered / consumed:.0f}x |")
  return lines + [""]


def _checkpoint_section(cost: dict) -> list[str]:
  with_saves, without = _median(cost["with"]), _median(cost["without"])
  interval, steps = _CHECKPOINT_INTERVAL.value, cost["steps"]
  # Saves inside the timed window: the one at the last step comes after it.
  saves = max(len(range(interval, steps, interval)), 1)
  blocked = _median(cost["with"], "checkpoint_time_sec")
  timed_examples = (steps - _STEPS_PER_LOOP.value) * cost["batch"]  # the first loop is untimed
  seconds_lost = timed_examples * (1 / with_saves - 1 / without)
  # Runs are taken in with/without pairs, back to back: their ratio cancels much of the
  # machine's drift between processes.
  paired = statistics.median(a["examples_per_sec"] / b["examples_per_sec"]
                             for a, b in zip(cost["with"], cost["without"]))
  within_run = _extra_seconds_per_save(cost["with"], interval, steps)
  return ["## Async checkpoint every "
          f"{interval} steps", "",
          f"distloop, batch {cost['batch']}, {cost['replicas']} replica(s), {steps} steps, "
          "alternating runs:", "",
          "| checkpoint.interval | examples/s | training blocked, all saves (summary.json) |",
          "| ---: | ---: | ---: |",
          f"| {steps} (at the end only) | {_spread(cost['without'])} | "
          f"{_median(cost['without'], 'checkpoint_time_sec'):.2f} s |",
          f"| {interval} | {_spread(cost['with'])} | {blocked:.2f} s |", "",
          f"Cost: **{1 - with_saves / without:.1%}** of throughput ({1 - paired:.1%} in the "
          "median of the paired, back-to-back runs), about "
          f"{seconds_lost / saves * 1000:.0f} ms per save over the {saves} save(s) inside the "
          "timed window (the host copy blocks training; the writer thread's work competes "
          "with it for the cores)." + (
              f" Within each run, the loops after a save took {within_run * 1000:.0f} ms "
              "longer per save than the loop that ends at the next save (the median over "
              "saves and runs: no drift between processes in it)." if within_run else ""), ""]


def _extra_seconds_per_save(runs: list[dict], interval: int, steps: int) -> float | None:
  """Median over saves of the time the loops after a save took beyond the loop that ends
  at the next save, the one furthest from it. None when an interval holds one loop."""
  loops_per_interval = interval // _STEPS_PER_LOOP.value
  if interval % _STEPS_PER_LOOP.value or loops_per_interval < 2:
    return None
  extras = []
  for run in runs:
    seconds = run["loop_seconds"]
    for save in range(interval, steps - interval + 1, interval):
      after = [seconds.get(save + i * _STEPS_PER_LOOP.value) for i in range(1, loops_per_interval)]
      baseline = seconds.get(save + interval)
      if baseline is not None and None not in after:
        extras.append(sum(after) - len(after) * baseline)
  return statistics.median(extras) if extras else None


def _memory_section(training: dict, peers: list[str]) -> list[str]:
  names = ["distloop", *peers]
  lines = ["## Peak RSS (MB)", "",
           "Each child's own peak resident set (`ru_maxrss` from `os.wait4`); median over the "
           "runs.", "",
           "| batch | replicas | " + " | ".join({"bare": "bare loop"}.get(name, name)
                                              for name in names) + " |",
           "| ---: | ---: |" + " ---: |" * len(names)]
  for (batch, replicas), result in training.items():
    runs = result["runs"]
    lines.append(f"| {batch} | {replicas} | "
                 + " | ".join(f"{_median(runs[name], 'peak_rss_mb'):.0f}"
                              for name in names) + " |")
  return lines + [""]


_NOTES = """## What differs between them

- Same: the model (`--model`: the seed CNN of configs/synthetic.py, or the MLP),
  its initial weights (seed 0), Adam(1e-3), the global batch, the strategy, the
  10,000 synthetic training examples held in memory, and TensorFlow's CPU kernels
  (--cpu_kernels; fit also tries the other ones and keeps the faster). orbit's
  model and Adam are tf-keras's (`TF_USE_LEGACY_KERAS=1`: what orbit is written
  for), the same layers given the same initial weights.
- Work per step: distloop also computes the gradient's global norm and sums
  examples, loss and correct predictions as values carried by its compiled loop,
  and checks every weight is finite once per loop; it all-reduces explicitly and
  applies the update through `merge_call`. fit computes loss and accuracy
  metrics. bare computes nothing beyond the update; bare_xla is bare with the
  whole step (forward, backward, Adam) in one XLA cluster. orbit runs the
  custom-training-loop tutorial's step: the loss over the global batch,
  `apply_gradients` in the replica step (tf-keras sums the gradients over
  replicas there), a loss mean and an accuracy metric (as Model Garden's trainers
  keep); tf-keras's Adam compiles its update with XLA on a GPU only.
- Between loops: distloop reads its sums (one host sync), logs a line and writes
  its TensorBoard scalars in one compiled call per loop, all inside its timed
  window; fit (verbose=0, no callbacks) and bare do nothing between steps;
  orbit's Controller reads the global step and the metrics and prints its log
  line after every loop (no summaries, no checkpoints: none configured).
- Data: distloop gathers each batch from uint8 arrays by a stateless permutation
  of every position (exact resume) and scales it to [0, 1] (in tf.data on a CPU,
  in the step on an accelerator); fit, bare and orbit read float32 arrays through
  `shuffle(10000).repeat().batch().prefetch()`.
  Both pipelines deliver far more than training consumes (the pipeline table).
- Timing: distloop's window is one process's wall clock between its first and last
  loop boundary, fit's between the end of its first and last execution (a callback),
  bare's and orbit's the difference of two timed runs in one warm process. All
  leave out tracing and start-up, and none includes the final eval, checkpoint or export.
- Steps per call: distloop, bare and orbit (its `tf.while_loop`) run
  `steps_per_loop` steps per tf.function call; fit runs its winning
  `steps_per_execution` (see fit's settings: where the larger one fails, fit pays
  Python and a dispatch on every step).
"""


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  repeats = 1 if _QUICK.value else REPEATS.value
  batches, replica_counts = [int(b) for b in BATCHES.value], [int(r) for r in REPLICAS.value]
  for batch in batches:
    for replicas in replica_counts:
      if batch % replicas:
        raise app.UsageError(f"batch {batch} does not divide into {replicas} replicas")
  peers, orbit_missing = _peers()
  if orbit_missing:
    _progress(orbit_missing)
  foreign_load = _ForeignLoad()

  training, pipeline = {}, {}
  for batch in batches:
    for replicas in replica_counts:
      _progress(f"training: batch {batch}, {replicas} replica(s)")
      training[batch, replicas] = _measure_training(batch, replicas, repeats, peers)
  for batch in batches if _PIPELINE.value else []:
    for replicas in replica_counts:
      pipeline[batch, replicas] = [_runner("pipeline", batch, replicas, steps_of(batch))
                                   for _ in range(repeats)]
      _progress(f"pipeline: batch {batch}, {replicas} replica(s): "
                f"{_median(pipeline[batch, replicas]):.0f} ex/s")
  checkpoint_cost = None
  if _CHECKPOINT_COST.value:
    checkpoint_batch = min(batches)
    checkpoint_replicas = 1 if 1 in replica_counts else replica_counts[0]
    _progress(f"checkpoint cost: batch {checkpoint_batch}, {checkpoint_replicas} replica(s)")
    checkpoint_cost = _measure_checkpoint_cost(
        checkpoint_batch, checkpoint_replicas, repeats,
        training[checkpoint_batch, checkpoint_replicas]["runs"]["distloop"])
  first_runs = next(iter(training.values()))["runs"]
  device = next((runs[0]["device"] for runs in first_runs.values()
                 if runs and "device" in runs[0]), "unknown")
  names = {"fit": "Keras fit", "bare": "a bare loop", "orbit": "orbit"}

  report = "\n".join([
      "# distloop throughput" + (" vs " + ", ".join(names[peer] for peer in peers[:-1])
                                 + (" and " if len(peers) > 1 else "") + names[peers[-1]]
                                 if peers else ""), "",
      *_machine(),
      f"- device that ran the steps: {device}",
      f"- other processes used {foreign_load.share():.0%} of the machine's CPU time while this "
      "ran (0% = a quiet machine; more makes every number noisier)", "",
      "Command: `" + " ".join(["python -m benchmarks.throughput", *sys.argv[1:]]) + "`", "",
      f"CPU kernels of distloop, the bare loops and orbit: "
      f"{ {'onednn': 'oneDNN', 'eigen': 'Eigen'}[_CPU_KERNELS.value]} "
      f"(TF_ENABLE_ONEDNN_OPTS={_onednn_env(_CPU_KERNELS.value)}).", "",
      f"Every number is the median of {repeats} fresh process(es)"
      + (f"; {', '.join(['distloop', *peers])} alternate" if peers else "")
      + f". Synthetic data, the {_model_name()}, Adam(1e-3), {_STEPS_PER_LOOP.value} steps "
      "per loop.", "",
      *([orbit_missing, ""] if orbit_missing else []),
      *_training_section(training, peers),
      *(_pipeline_section(pipeline, training) if pipeline else []),
      *(_checkpoint_section(checkpoint_cost) if checkpoint_cost else []),
      *_memory_section(training, peers),
      _NOTES])
  print(report)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(report)


if __name__ == "__main__":
  app.run(main)
