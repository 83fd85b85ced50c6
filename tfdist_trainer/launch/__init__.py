"""tfdist-launch (TF-free): local clusters of tfdist-train tasks, their supervision, Kubernetes manifests.

Its modules: `tfdist-launch`: `main` (the command), `flags`, `local_tasks` (which processes),
`ports` (free ports below the kernel's ephemeral range, so no outgoing connection takes one
before its task binds it), `parent_watch` (a task it started ends when the launcher is gone),
`supervisor` (the local process supervisor: start, watch, restart, tear down; a side-car given
up never ends training), `output_relay` (each task's output to its log and, filtered, the
console; a failure reported once), `restart_budget` (`--backoff_limit` restarts within
`--backoff_window_s`, per-task delays), `process_group` (signalling a task's process group),
`console` (which task lines reach the console), `failure_cause` (a failed task's traceback held
back, its cause in one line), `task_console` (the same for `tfdist-train` started alone: a
console process that keeps the task's log), `private_network` + `netns` (a private network
namespace), `emit` + `k8s/` (Kubernetes manifests: `job` settings, `resources` (each role's CPU
and memory), `image` (where the pods look for gin files and modules), `objects`, one module per
flavor: `tfjob`, `indexed`, `jobset`; `output`)
"""
