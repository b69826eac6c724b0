"""The guarantee workloads, one module each: its `WORKLOAD` (a catalogue entry: flags as a user
types them, how to score its export, the tolerances it has measured, the checks that do not
apply and why) and any code only it uses (a Task, a model builder). Plug-ins that feature
tests share stay in tests/plugins/, named by the workload's flags. catalogue.py collects every
module here: adding a workload is adding a file."""
