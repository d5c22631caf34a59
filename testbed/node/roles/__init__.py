"""The roles that run inside the nodes, one file each: the parameter server (ps.py), a worker
(worker.py), the evaluator (evaluator.py), a decentralized worker (peer.py) and its coordinator
(coordinator.py), the stream source (broker.py), background stress (stress.py); what they share
is in common.py. They talk only through transport.py and write only through records/metrics.py.

Protocol of the PS algorithms (every message is a wire.Message):
  worker -> ps   hello | push{base_version, step} + update tensors | vote{flag, step} | bye
  ps -> worker   model{version} + parameter tensors | decision{sync} | stop
  eval -> ps     hello | eval_ready | target_reached{accuracy, version}
  ps -> eval     evaluate{version, updates_received, time, final, repeat} + parameters | stop
                 (repeat: the model of the previous evaluate, unchanged: no parameters)
The decentralized roles' protocol is in peer.py.

Which function runs a node is data, `module:function`: the algorithm picks the roles (its
strategy says whether it is decentralized), the runner puts the target in the node's RoleConfig,
and runtimes start what they are handed without importing any role.
"""

from __future__ import annotations

_HERE = "testbed.node.roles"
PS_ROLES = {
    "ps": f"{_HERE}.ps:run_ps",
    "worker": f"{_HERE}.worker:run_worker",
    "evaluator": f"{_HERE}.evaluator:run_evaluator",
    "broker": f"{_HERE}.broker:run_broker_node",
    "producer": f"{_HERE}.broker:run_broker_node",
}
# Without a parameter server the `ps` node coordinates, and workers exchange with their peers.
DECENTRALIZED_ROLES = {**PS_ROLES, "ps": f"{_HERE}.coordinator:run_coordinator",
                       "worker": f"{_HERE}.peer:run_peer_worker"}


# Roles that run a foreign image's own entrypoint (Apache Kafka's): nothing of edgebed's runs there.
FOREIGN_ROLES = ("kafka",)


COMMAND_ROLE = f"{_HERE}.command:run_command"  # a command workload's every node (roles/command.py)


def role_target(role: str, decentralized: bool, command: bool = False) -> str:
    """The `module:function` that runs `role` for a PS-based or a decentralized algorithm, or a
    command workload ("" for a foreign image's role)."""
    if role in FOREIGN_ROLES:
        return ""
    if command and role in ("ps", "worker", "evaluator"):
        return COMMAND_ROLE
    return (DECENTRALIZED_ROLES if decentralized else PS_ROLES)[role]


def resolve_target(target: str):
    """The function a `module:function` target names (imported in the node's process)."""
    import importlib

    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)
