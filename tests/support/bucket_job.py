"""A job on a bucket model_dir inside a private network namespace, with its own emulator.

`python tests/support/bucket_job.py SCHEME COPY_TO MODULE [ARGS ...]` starts the emulator of SCHEME
(tests/support/object_stores.py) in this namespace (a multi-process job runs under
tests.support.processes.loopback_only(), where the test's own emulators cannot be reached),
runs `python -m MODULE ARGS` with `{url}` in ARGS replaced by a fresh bucket model_dir
and the store's environment, then copies the bucket's model_dir into COPY_TO (for the
test to read with plain orbax) and exits with the job's exit code. Its output is the
job's, then `bucket_job: copied N objects`.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.support.object_stores import Store  # pylint: disable=wrong-import-position


def main(scheme: str, copy_to: str, module: str, *args: str) -> int:
  store = Store(scheme, os.path.join(copy_to + ".store"))
  try:
    url = store.new_url("run")
    command = [sys.executable, "-m", module, *(arg.replace("{url}", url) for arg in args)]
    code = subprocess.run(command, env={**os.environ, **store.env}, check=False).returncode
    names = store.list(url)
    for name in names:
      path = os.path.join(copy_to, *name.split("/"))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "wb") as f:
        f.write(store.read(f"{url}/{name}"))
    print(f"bucket_job: copied {len(names)} objects", flush=True)
    return code
  finally:
    store.close()


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:]))
