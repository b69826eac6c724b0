"""Says in pytest's summary when multi-process tests were skipped, and why: without a
private network namespace they would run TensorFlow's gRPC servers on 0.0.0.0."""
import trainer  # noqa: F401  first: it picks the CPU kernels before TensorFlow loads
from tests.processes import LOOPBACK_SKIP


def pytest_terminal_summary(terminalreporter):
  skipped = [report for report in terminalreporter.stats.get("skipped", [])
             if LOOPBACK_SKIP in str(report.longrepr)]
  if skipped:
    reason = str(skipped[0].longrepr[-1]).removeprefix("Skipped: ")
    terminalreporter.write_sep("=", f"{len(skipped)} {reason}", yellow=True, bold=True)
