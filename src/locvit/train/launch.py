"""Starting a training job's processes: one, one per GPU of a node, or one torchrun per node of a SLURM job.

The train rule puts ``prefix`` before ``train ...``: ``python -m locvit``; on one node with G > 1 GPUs
``torchrun --standalone`` (a private rendezvous on a free port); on N > 1 nodes ``locvit launch``, in the job's
batch step: ``job_command`` reads the allocation (``scontrol show job``: the executor drops ``SLURM_*``), takes
the first node and a free port as rendezvous and runs ``srun --kill-on-bad-exit=1`` of ``agent_command``, one
torchrun per node (task 0 hosts the store, from ``SLURM_PROCID``). ``LOCVIT_NODE_ADDRESS`` maps node names to
addresses (``{node}-ib``); a rendezvous that cannot complete fails after ``LOCVIT_RDZV_TIMEOUT`` seconds
(default 300) naming the endpoint. Training is the same for any process layout (``locvit.train.distributed``).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from locvit.errors import LocvitError

log = logging.getLogger(__name__)

#: Seconds within which a rendezvous must complete (every node joined), else the job fails.
DEFAULT_RDZV_TIMEOUT = 300
#: torchrun's words for a rendezvous that did not complete (its exceptions' names). Not
#: RendezvousClosedError: a rendezvous closes when another node's training failed, which
#: that node's log explains.
RDZV_FAILURES = ("RendezvousConnectionError", "RendezvousTimeoutError", "RendezvousStateError")
#: How a SLURM node name becomes the address other nodes reach it at (``{node}`` replaced).
ADDRESS_VAR = "LOCVIT_NODE_ADDRESS"


class LaunchError(LocvitError, RuntimeError):
    """The processes of a training job could not be started; the message says what to do."""


#: The variable naming the Python that runs a job's ``locvit`` (the Snakefile sets it to its own
#: interpreter): the rules' commands read it in the shell, so no path enters what Snakemake records.
PYTHON_ENV = "LOCVIT_PYTHON"
#: That interpreter in a rule's shell command (Snakemake's bash strict mode stops at an unset one).
PYTHON = f'"${PYTHON_ENV}"'


def prefix(nodes: int, gpus_per_node: int, python: str | None = None) -> str:
    """The command before ``train ...`` for a job of ``nodes`` nodes with ``gpus_per_node`` GPUs each.

    One process per GPU, or one per node without GPUs (gloo on the CPU). ``python``: the interpreter's
    path; by default the shell's ``PYTHON_ENV``.
    """
    py = PYTHON if python is None else shlex.quote(python)
    if nodes > 1:
        return f"{py} -m locvit launch --nodes {nodes} --gpus-per-node {gpus_per_node} --"
    if gpus_per_node > 1:
        return f"{py} -m torch.distributed.run --standalone --nproc_per_node {gpus_per_node} -m locvit"
    return f"{py} -m locvit"


#: The SLURM executor's resources of a training job (workflow/rules/train.smk), in that order.
SLURM_KEYS = ("nodes", "gpu", "gres", "mpi", "tasks", "tasks_per_gpu", "cpus_per_task", "mem_mb", "runtime")


def slurm_resources(sizes: dict) -> dict[str, int | str | None]:
    """A training job's SLURM executor resources from a variant's ``resources`` (locvit.config.run.train_resources).

    One node: ``nodes`` 1 (else SLURM may spread ``--gpus`` over nodes) and ``gpu`` (sbatch
    ``--gpus``). N > 1 nodes: ``nodes``, one task per node (``tasks``), the GPUs per node through
    ``gres``, and ``mpi`` so that the executor runs the rule's shell in the batch step
    (``locvit launch`` starts the job steps); ``tasks_per_gpu`` 0 keeps the executor from
    adding ``--ntasks-per-gpu``. None leaves a resource unset.
    """
    nodes, gpus = sizes["nodes"], sizes["gpus"]
    several = nodes > 1
    return {
        "nodes": nodes,
        "gpu": None if several else gpus,
        "gres": f"gpu:{gpus}" if several and gpus else None,
        "mpi": "srun" if several else None,
        "tasks": nodes if several else None,
        "tasks_per_gpu": 0 if several else None,
        "cpus_per_task": sizes["cpus"],
        "mem_mb": sizes["mem_mb"],
        "runtime": sizes["runtime"],
    }


def shape(resources) -> tuple[int, int]:
    """(nodes, GPUs per node) of a job from the resources SLURM was asked for (``--set-resources`` included).

    Raises LaunchError for a node count the launcher would not use: only a variant's
    ``resources.nodes`` sets the multi-node resources (tasks, mpi). Over several nodes,
    ``nodes`` 1 is allowed: the agents then share one node (the one-node test cluster).
    """
    nodes = int(resources.get("nodes") or 1)
    if resources.get("mpi"):
        if nodes not in (1, int(resources["tasks"])):
            raise LaunchError(
                f"train: nodes={nodes} from --set-resources for a job of {resources['tasks']} nodes: "
                "a training job's nodes come from its variant's resources.nodes in params (which "
                "also sets one task per node); set it there"
            )
        gres = str(resources.get("gres") or "")
        gpus = int(gres.rsplit(":", 1)[1]) if gres.startswith("gpu") and ":" in gres else 0
        return int(resources["tasks"]), gpus
    if nodes > 1:
        raise LaunchError(
            f"train: nodes={resources['nodes']} from --set-resources: a training job's nodes come "
            "from its variant's resources.nodes in params (which also sets one task per node and "
            "the launcher); set it there"
        )
    return 1, int(resources.get("gpu") or 0)


def rule_prefix(resources, python: str | None = None) -> str:
    """``prefix`` for a job of these resources (see ``shape``)."""
    return prefix(*shape(resources), python)


@dataclass(frozen=True)
class Allocation:
    """What ``scontrol show job`` says of a job: its id, nodes (in SLURM's order) and CPUs per task."""

    job_id: str
    nodes: list[str]
    cpus_per_task: int


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compressed host list (``gpu[01-03,07],cpu1``, ``r[1-2]n[1-2]``) as host names, in order."""
    hosts: list[str] = []
    parts, depth, start = [], 0, 0  # split on the commas outside brackets
    for i, ch in enumerate(hostlist):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(hostlist[start:i])
            start = i + 1
    parts.append(hostlist[start:])
    for part in filter(None, parts):
        m = re.match(r"([^\[\]]*)\[([^\]]+)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        head, ranges, tail = m.groups()  # the first bracket; the tail's own brackets expand recursively
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.extend(expand_hostlist(f"{head}{n:0{len(lo)}d}{tail}"))
    return hosts


def parse_scontrol(text: str) -> Allocation:
    """An ``Allocation`` from ``scontrol show job -o <id>`` (``Key=Value`` fields)."""
    fields = dict(re.findall(r"(\S+?)=(\S*)", text))
    missing = [k for k in ("JobId", "NodeList") if not fields.get(k)]
    if missing or fields["NodeList"] in ("(null)", "None"):
        raise LaunchError(
            f"scontrol did not describe a running job (no {', '.join(missing) or 'NodeList'}): {text.strip()[:300]!r}"
        )
    return Allocation(fields["JobId"], expand_hostlist(fields["NodeList"]), int(fields.get("CPUs/Task", "1") or 1))


def allocation(env: dict[str, str] | None = None) -> Allocation:
    """This SLURM job's allocation (the batch step's ``SLURM_JOB_ID``)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise LaunchError(
            "training over several nodes runs inside a SLURM job (no SLURM_JOB_ID here): "
            "run the study with `snakemake --profile cluster`, or set the variant's "
            "resources.nodes to 1 on one machine"
        )
    proc = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise LaunchError(f"`scontrol show job -o {job}` failed: {proc.stderr.strip()}")
    return parse_scontrol(proc.stdout)


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous store binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rdzv_timeout(env: dict[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    raw = env.get("LOCVIT_RDZV_TIMEOUT", str(DEFAULT_RDZV_TIMEOUT))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise LaunchError(
            f"LOCVIT_RDZV_TIMEOUT={raw!r}: a whole number of seconds > 0 (default {DEFAULT_RDZV_TIMEOUT})"
        )
    return value


def node_address(node: str, env: dict[str, str] | None = None) -> str:
    """The address at which other nodes reach ``node``: its name, or ``LOCVIT_NODE_ADDRESS`` filled in."""
    env = os.environ if env is None else env
    pattern = env.get(ADDRESS_VAR)
    if not pattern:
        return node
    if "{node}" not in pattern:
        raise LaunchError(
            f"{ADDRESS_VAR}={pattern!r} must contain {{node}} (e.g. '{{node}}-ib'): it maps every "
            "job's node names to addresses, and a fixed address would be one job's node only"
        )
    return pattern.replace("{node}", node)


def job_command(
    alloc: Allocation,
    nodes: int,
    gpus_per_node: int,
    args: list[str],
    env: dict[str, str] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """``srun`` of one agent per node of ``alloc`` (run on the job's first node).

    Task 0 runs on the first node, where this launcher runs and checks the port free; fewer nodes than agents
    (the one-node test cluster) put several on a node. The step asks for CPUs and GPUs itself: the executor
    removed the variables srun would inherit them from.
    """
    host = node_address(alloc.nodes[0], env)
    step = ["srun", f"--ntasks={nodes}"]
    if len(alloc.nodes) >= nodes:
        step += [f"--nodes={nodes}", "--ntasks-per-node=1"]
    step += ["--kill-on-bad-exit=1", f"--cpus-per-task={alloc.cpus_per_task}"]
    if gpus_per_node:
        step.append(f"--gres=gpu:{gpus_per_node}")
    return [
        *step,
        python,
        "-m",
        "locvit",
        "launch",
        "--agent",
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(gpus_per_node),
        "--endpoint",
        f"{host}:{free_port()}",
        "--rdzv-id",
        alloc.job_id,
        "--",
        *args,
    ]


def agent_command(
    nodes: int,
    gpus_per_node: int,
    endpoint: str,
    rdzv_id: str,
    is_host: bool,
    timeout: int,
    args: list[str],
    python: str = sys.executable,
    local_addr: str | None = None,
) -> list[str]:
    """One node's torchrun: joins the c10d rendezvous at ``endpoint`` (hosting it when ``is_host``).

    ``local_addr``: this node's address for the others (torchrun's ``--local-addr``; by
    default torchrun takes the host's fully qualified name).
    """
    conf = f"is_host={int(is_host)},join_timeout={timeout},read_timeout={timeout},last_call_timeout=1"
    addr = ["--local-addr", local_addr] if local_addr else []
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(max(1, gpus_per_node)),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        conf,
        *addr,
        "--max-restarts",
        "0",
        "-m",
        "locvit",
        *args,
    ]


def run_agent(
    nodes: int, gpus_per_node: int, endpoint: str, rdzv_id: str, args: list[str], env: dict[str, str] | None = None
) -> int:
    """Run this node's torchrun; on a rendezvous that did not complete, say why and where, and return 1.

    torchrun's output passes through unchanged; a line naming one of its rendezvous
    exceptions marks the failure as the rendezvous's rather than training's.
    """
    env = dict(os.environ if env is None else env)
    # SLURM's task number; LOCVIT_NODE_RANK where agents are started by hand (tests, no SLURM).
    node = int(env.get("SLURM_PROCID", env.get("LOCVIT_NODE_RANK", "0")))
    timeout = rdzv_timeout(env)
    local_addr = node_address(env.get("SLURMD_NODENAME") or socket.gethostname(), env) if env.get(ADDRESS_VAR) else None
    cmd = agent_command(nodes, gpus_per_node, endpoint, rdzv_id, node == 0, timeout, args, local_addr=local_addr)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    seen: list[str] = []
    # This process must outlive its torchrun. SLURM's SIGTERM (scancel, a failed node, the time limit) reaches
    # every process of the job step; dying at once would orphan torchrun, which may hang in its shutdown (its
    # rendezvous host lost: up to read_timeout), out of reach of the SIGKILL SLURM sends KillWait later where it
    # tracks processes by parent (proctrack/linuxproc, pgid). So wait for torchrun; started by hand (no
    # SLURM step), pass the signal on to it.
    in_step = "SLURM_STEP_ID" in env

    def on_signal(signum, frame) -> None:
        if not in_step and proc.poll() is None:
            proc.send_signal(signum)

    main = threading.current_thread() is threading.main_thread()  # (handlers can be set there only)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}

    def relay() -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            # (heartbeat warnings name the same errors when another node dies during training)
            if any(name in line for name in RDZV_FAILURES) and "heartbeat" not in line:
                seen.append(line.strip())  # the last one is the exception's own line

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    reader.join(timeout=10)
    waited = time.monotonic() - started
    # A rendezvous gives up within its timeout; a failure long after it came from training.
    if code != 0 and seen and waited < timeout + 120:
        role = "hosting it" if node == 0 else "joining it"
        log.error(
            f"locvit launch: the rendezvous of {nodes} nodes at {endpoint} did not complete "
            f"(node {node}, {role}, gave up after {waited:.0f} s; limit LOCVIT_RDZV_TIMEOUT={timeout} s): "
            f"{seen[-1][:300]}\n  Check that every node reaches {endpoint} (the job's first node: firewall, "
            f"the address of its name; {ADDRESS_VAR}, e.g. '{{node}}-ib', maps names to other addresses) "
            f"and that all {nodes} tasks started (squeue, the job's log)."
        )
        return 1
    return code


def run_job(nodes: int, gpus_per_node: int, args: list[str]) -> int:
    """On the job's first node: start one agent per node with srun and return its exit status."""
    alloc = allocation()
    cmd = job_command(alloc, nodes, gpus_per_node, args)
    if len(alloc.nodes) < nodes:
        log.warning(
            f"locvit launch: job {alloc.job_id} has {len(alloc.nodes)} node(s) for {nodes} agents: they "
            "share nodes (the job asks SLURM for resources.nodes; a --set-resources nodes override lowered it?)"
        )
    log.info(
        f"locvit launch: {nodes} nodes x {max(1, gpus_per_node)} processes of job {alloc.job_id} "
        f"({', '.join(alloc.nodes)}), rendezvous at {cmd[cmd.index('--endpoint') + 1]}"
    )
    return subprocess.run(cmd).returncode
