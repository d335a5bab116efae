"""A SLURM cluster of one or two nodes on this machine, with accounting, for `make test-cluster`.

Two nodes (``LocalSlurm(nodes=2)``, the cluster test's) are two hosts as far as the network
goes: each ``slurmd`` runs in a network namespace of its own (``locvit-n1``, ``locvit-n2``),
reached over a virtual link the cluster makes and removes (:class:`TestNetwork`): a bridge
``locvit-br0`` in the root namespace holding 10.213.18.1/24, one veth pair per node with
its end inside the node's namespace named ``locvit0`` at 10.213.18.11 or .12. Nothing else
is on that subnet, nothing is routed off it (the namespaces have no default route, and the
machine's forwarding is not touched), and no other interface or address changes. slurmctld,
slurmdbd, MariaDB and munged stay in the root namespace; slurmd and so every job step and
job process on node i see node i's network only (its ``lo`` and ``locvit0``), and reach the
controller at 10.213.18.1. munge's socket is a file, shared by the namespaces as the file
system is. The nodes are declared by name and address (``NodeName=locvit1
NodeAddr=10.213.18.11``; ``slurmd -N locvit1``); the names resolve nowhere, as on a site
where node names are not the training network's: inside each namespace ``locvitI-net``
resolves to node i's address (a hosts file in the cluster's folder, mounted over /etc/hosts
in a mount namespace of node i's slurmd, as ``ip netns exec`` does with /etc/netns), so jobs get
``LOCVIT_NODE_ADDRESS='{node}-net'`` and ``GLOO_SOCKET_IFNAME=locvit0`` (:attr:`LocalSlurm.job_env`).
Whatever a killed run left (namespaces and links named ``locvit-...``) is removed
before the next one starts. One node (``LocalSlurm()``, the grouping benchmark's) is today's
layout: slurmd in the root namespace on 127.0.0.1.


Everything but the two config files (and the network above) lives in one private folder: a MariaDB server on a
loopback port for slurmdbd, munged on its own socket and key, the daemons' state, spool
and logs. slurmdbd, slurmctld and slurmd are started in the foreground as children of
this process, so :meth:`LocalSlurm.stop` ends them all and removes what it wrote,
whatever happened. The system's munge key and MariaDB are not touched.

The configs go to the default place, /etc/slurm/slurm.conf and slurmdbd.conf, as on a
real cluster: Snakemake's slurm-jobstep executor drops every ``SLURM_*`` variable
(``SLURM_CONF`` included) before its inner ``srun``, so a config anywhere else is not
found inside the job. A machine that already has its own /etc/slurm/slurm.conf is left
alone (the test skips and says so); ours carry a marker line, and a stale one left by a
killed run is replaced.

Snakemake's SLURM executor polls ``sacct``, so accounting (slurmdbd, and the database
behind it) is not optional. The node is declared with the CPUs and memory ``slurmd -C``
reports (memory shared between the nodes). Partitions ``cpu`` and ``gpu`` (the names
cluster/config.yaml uses) hold every node; none has GPUs: the test asks for ``gpu=0``. A node
that stops answering is declared DOWN after ``SlurmdTimeout`` (:data:`SLURMD_TIMEOUT_S`), and its
jobs end as NODE_FAIL (requeued when they were submitted with ``--requeue``), their processes on the
other nodes SIGKILLed ``KillWait`` (:data:`KILL_WAIT_S`) after SIGTERM.

Needs root (slurmd runs jobs as their user; SlurmUser is root; the namespaces), Debian's
``slurm-wlm slurmdbd munge mariadb-server`` and ``iproute2`` (``ip``); :func:`unavailable` says why not.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers import free_port

PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server", "iproute2")
BINARIES = (
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "sacctmgr",
    "sbatch",
    "sacct",
    "munged",
    "mariadbd",
    "mariadb-install-db",
    "mariadb",
    "ip",
    "nsenter",
    "unshare",
)
CLUSTER = "locvit"
CONF_DIR = Path("/etc/slurm")
MARKER = "# written by locvit's tests/slurm_cluster.py; removed when its cluster stops\n"

# The two-node cluster's network (TestNetwork). Every name starts with "locvit-" or is "locvit0" inside our
# own namespaces: what a killed run left is found by that name and removed.
SUBNET = ipaddress.ip_network("10.213.18.0/24")
CONTROLLER_ADDRESS = "10.213.18.1"  # the bridge, in the root namespace: slurmctld and slurmdbd
BRIDGE = "locvit-br0"
LINK = "locvit0"  # each node's interface, inside its namespace (GLOO_SOCKET_IFNAME)
NODE_ADDRESS = "{node}-net"  # LOCVIT_NODE_ADDRESS: node name -> a name resolving to its address on SUBNET
#: Seconds without an answer after which slurmctld declares a node DOWN and ends its jobs (NODE_FAIL).
SLURMD_TIMEOUT_S = 20
#: Seconds between SLURM's SIGTERM to a job's processes (scancel, NODE_FAIL) and its SIGKILL (default 30).
KILL_WAIT_S = 10


def node_name(i: int) -> str:
    return f"locvit{i}"


def namespace(i: int) -> str:
    return f"locvit-n{i}"


def node_address(i: int) -> str:
    return str(SUBNET.network_address + 10 + i)


def node_overrides(
    runtimes: dict[str, int] | None = None,
    default_runtime: int = 30,
    train_extra: str | None = None,
    one_node: bool = True,
) -> list[str]:
    """Snakemake flags fitting every sized rule of cluster/config.yaml to the test cluster's nodes (2 CPUs, no GPU).

    They replace the profile's default-resources, set-resources and set-threads: 1 CPU, 2 GB and no GPU
    a job, a rule's runtime from ``runtimes`` (minutes, else ``default_runtime``). train and search_train,
    sized by the study's resources rather than the profile, are overridden too; with ``one_node`` their
    nodes as well: a multi-node variant's tasks share the one node. Without it (the two-node cluster) a
    variant's nodes are its own. ``train_extra`` replaces train's slurm_extra.
    """
    import yaml

    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "cluster" / "config.yaml").read_text())
    runtimes = runtimes or {}
    trainers = ("train", "search_train")
    sized = profile["set-resources"]
    resources = [
        f"{rule}:{key}={value}"
        for rule, sizes in sized.items()
        for key, value in (
            ("gpu", 0),
            ("cpus_per_task", 1),
            ("mem_mb", 2000),
            ("runtime", runtimes.get(rule, default_runtime)),
        )
        if key in sizes or rule in trainers
    ]
    if one_node:
        resources += [f"{rule}:nodes=1" for rule in trainers]
    resources += [
        f"{rule}:slurm_extra={sizes['slurm_extra']}"
        for rule, sizes in sized.items()
        if "slurm_extra" in sizes and not (rule == "train" and train_extra)
    ]
    if train_extra:
        resources.append(f"train:slurm_extra={train_extra}")
    return [
        "--default-resources",
        "slurm_partition=cpu",
        "mem_mb=1500",
        f"runtime={default_runtime}",
        "cpus_per_task=1",
        "--set-resources",
        *resources,
        "--set-threads",
        *[f"{rule}=1" for rule in profile["set-threads"]],
    ]


def _ours(path: Path) -> bool:
    try:
        return path.read_text().startswith(MARKER)
    except OSError:
        return False


def unavailable() -> str | None:
    """Why the cluster cannot be brought up here, or None."""
    if os.geteuid() != 0:
        return "the SLURM test cluster needs root (slurmd starts jobs as their user)"
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return (
            f"missing {', '.join(missing)}: install Debian's {' '.join(PACKAGES)} "
            "(`make test-cluster` does, as root with apt-get)"
        )
    for name in ("slurm.conf", "slurmdbd.conf"):
        if (CONF_DIR / name).exists() and not _ours(CONF_DIR / name):
            return f"{CONF_DIR / name} exists (this machine's own SLURM): the test cluster will not replace it"
    return None


def _kill_job_steps() -> None:
    """Kill every slurmstepd and what it runs: job steps outlive slurmd.

    This machine's only SLURM is ours (:func:`unavailable` checked), so every slurmstepd is ours.
    """
    import psutil

    steps = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "slurmstepd"]
    doomed = []
    for step in steps:
        try:
            doomed += step.children(recursive=True) + [step]
        except psutil.NoSuchProcess:
            pass
    for proc in doomed:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(doomed, timeout=10)


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run([_which("ip"), *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


class NodeNetwork:
    """The two-node cluster's virtual network: a bridge in the root namespace, a namespace and a veth pair per node.

    :meth:`create` first removes whatever a killed run left (:meth:`remove`: every namespace, link and
    hosts file of ours, by name), then refuses a subnet another interface or route uses.
    """

    def __init__(self, nodes: int, folder: Path) -> None:
        self.nodes = nodes
        self.hosts = folder / "hosts"  # node i's /etc/hosts (LocalSlurm._slurmd)

    @staticmethod
    def remove() -> None:
        """Delete every link and namespace named ``locvit-...`` (idempotent)."""
        links = [line.split(":", 2)[1].strip().split("@")[0] for line in _ip("-o", "link", "show").splitlines()]
        for link in links:
            if link.startswith("locvit-v"):  # a veth's root end: deleting it deletes its pair
                _ip("link", "del", link, check=False)
        if BRIDGE in links:
            _ip("link", "del", BRIDGE, check=False)
        for line in _ip("netns", "list").splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith("locvit-n"):
                for pid in NodeNetwork._pids_in(name):  # a killed run's slurmd and jobs, still in it
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                _ip("netns", "del", name, check=False)

    @staticmethod
    def _subnet_in_use() -> str | None:
        for entry in json.loads(_ip("-4", "-j", "addr", "show") or "[]"):
            for info in entry.get("addr_info", []):
                if ipaddress.ip_address(info["local"]) in SUBNET:
                    return f"{entry['ifname']} has {info['local']}"
        for route in json.loads(_ip("-4", "-j", "route", "show", "table", "all") or "[]"):
            dst = route.get("dst", "default")
            if dst in ("default", "broadcast") or route.get("type") in ("broadcast", "local"):
                continue
            try:
                if ipaddress.ip_network(dst, strict=False).overlaps(SUBNET):
                    return f"route {dst} via {route.get('dev')}"
            except ValueError:
                continue
        return None

    def create(self) -> None:
        self.remove()
        used = self._subnet_in_use()
        if used:
            raise RuntimeError(
                f"the test cluster's subnet {SUBNET} is in use on this machine ({used}): "
                "change SUBNET in tests/slurm_cluster.py"
            )
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{CONTROLLER_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        self.hosts.write_text(
            "127.0.0.1 localhost\n"
            + "".join(f"{node_address(i)} {NODE_ADDRESS.format(node=node_name(i))}\n" for i in range(1, self.nodes + 1))
        )
        for i in range(1, self.nodes + 1):
            ns, veth = namespace(i), f"locvit-v{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", LINK, "netns", ns)
            _ip("link", "set", veth, "master", BRIDGE)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{node_address(i)}/{SUBNET.prefixlen}", "dev", LINK)
            _ip("-n", ns, "link", "set", LINK, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def cut(i: int) -> None:
        """Node i's link down: nothing reaches it or leaves it (its processes get no error, as on a lost host)."""
        _ip("link", "set", f"locvit-v{i}", "down")

    @staticmethod
    def mend(i: int) -> None:
        _ip("link", "set", f"locvit-v{i}", "up")

    @staticmethod
    def pids(i: int) -> list[int]:
        """Every process in node i's network namespace (its slurmd, slurmstepds, jobs)."""
        return NodeNetwork._pids_in(namespace(i))

    @staticmethod
    def _pids_in(name: str) -> list[int]:
        inode = os.stat(f"/run/netns/{name}").st_ino
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.stat(entry / "ns" / "net").st_ino == inode:
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found


class LocalSlurm:
    """Start with :meth:`start`, always :meth:`stop`. ``env`` is what clients (sbatch, Snakemake) need,
    ``job_env`` what a job's environment needs on top (the node addresses, gloo's interface).

    ``nodes`` 1: one slurmd in the root namespace at 127.0.0.1; 2: two, each in its namespace
    (:class:`NodeNetwork`), named :func:`node_name` (1, 2) at :func:`node_address`.
    """

    def __init__(self, nodes: int = 1) -> None:
        if nodes not in (1, 2):
            raise ValueError(f"nodes={nodes}: the test cluster has one node or two")
        self.nodes = nodes
        self.root = Path(tempfile.mkdtemp(prefix="locvit-slurm-"))
        self.root.chmod(0o755)  # munged (user munge) must reach its own folder inside
        self.net = NodeNetwork(nodes, self.root) if nodes > 1 else None
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = CONF_DIR / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.job_env = {"SLURM_CONF": str(self.conf)}
        if self.net:
            self.job_env.update(LOCVIT_NODE_ADDRESS=NODE_ADDRESS, GLOO_SOCKET_IFNAME=LINK)
        self.controller = CONTROLLER_ADDRESS if self.net else "127.0.0.1"

    # --- life cycle -------------------------------------------------------------------
    def start(self) -> LocalSlurm:
        try:
            if self.net:
                self.net.create()
            self._munge()
            self._mariadb()
            self._write_configs()
            self._daemon("slurmdbd", [_which("slurmdbd"), "-D"])
            self._wait(lambda: self._ok(["sacctmgr", "-n", "list", "cluster"]), "slurmdbd to answer", "slurmdbd")
            self._run(["sacctmgr", "-i", "add", "cluster", CLUSTER])
            self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i"])
            for i in range(1, self.nodes + 1):
                self._slurmd(i)
            self._wait(self._node_idle, "every node to come up idle", "slurmctld")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End every daemon (slurmd first, MariaDB last) and remove the folder."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--partition=cpu,gpu"], env=self.env, capture_output=True, timeout=30)
            end = time.monotonic() + 30
            while time.monotonic() < end and self._jobs_alive():
                time.sleep(0.5)
        slurmds = [name for name in self.procs if name.startswith("slurmd@")]
        for name in (*slurmds, "slurmctld", "slurmdbd", "mariadb", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        _kill_job_steps()
        if self.net:
            for i in range(1, self.nodes + 1):  # what a lost node's slurmd left running, if any
                self._kill(NodeNetwork.pids(i) if Path(f"/run/netns/{namespace(i)}").exists() else [])
            self.net.remove()
        for name in ("slurm.conf", "slurmdbd.conf"):
            if _ours(CONF_DIR / name):
                (CONF_DIR / name).unlink()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- losing a node ----------------------------------------------------------------
    def lose_node(self, i: int) -> list[int]:
        """Node i goes away as a host does when it dies: its link cut first (nothing it sends reaches the
        others), then every process in its namespace (slurmd, job steps, the job's processes) SIGKILLed.
        The others find out only through their own timeouts. Returns the pids killed."""
        if not self.net:
            raise RuntimeError("only the two-node cluster can lose a node")
        NodeNetwork.cut(i)
        pids = NodeNetwork.pids(i)
        self._kill(pids)
        self.procs.pop(f"slurmd@{i}", None)
        return pids

    def restore_node(self, i: int, timeout: float = 120) -> None:
        """Node i back: its link up and its slurmd started; returns once slurmctld has it idle or allocated."""
        NodeNetwork.mend(i)
        self._slurmd(i)
        self._wait(
            lambda: self.node_states().get(node_name(i), "").rstrip("*~#!%$@^-") in ("idle", "alloc", "mix"),
            f"node {node_name(i)} to come back",
            f"slurmd@{i}",
            timeout,
        )
        # slurmctld reaching the node is not yet the nodes reaching each other: a job started at once failed
        # its srun to the other node ("Communication connection failure") for a moment after the link was up.
        self._wait(self._nodes_reach_each_other, "the nodes to reach each other's slurmd", f"slurmd@{i}", timeout)

    def _nodes_reach_each_other(self) -> bool:
        probe = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()"
        return all(
            subprocess.run(
                [
                    _which("nsenter"),
                    f"--net=/run/netns/{namespace(a)}",
                    sys.executable,
                    "-c",
                    probe,
                    node_address(b),
                    str(self.slurmd_port),
                ],
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
            for a in range(1, self.nodes + 1)
            for b in range(1, self.nodes + 1)
            if a != b
        )

    @staticmethod
    def _kill(pids: list[int]) -> None:
        import psutil

        procs = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                proc.kill()
                procs.append(proc)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        """The end of every daemon's log (for a failing test's message)."""
        out = []
        for log in sorted((self.root / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    # --- helpers ----------------------------------------------------------------------
    def _run(self, cmd: list[str], **kw) -> str:
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120, **kw)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{self.log_tail()}"
            )
        return proc.stdout

    def _ok(self, cmd: list[str]) -> bool:
        return subprocess.run(cmd, env=self.env, capture_output=True, timeout=60).returncode == 0

    def _daemon(self, name: str, cmd: list[str], user: str | None = None) -> None:
        (self.root / "log").mkdir(exist_ok=True)
        out = open(self.root / "log" / f"{name}.out.log", "w")
        if user:
            cmd = ["runuser", "-u", user, "--", *cmd]
        self.procs[name] = subprocess.Popen(
            cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _wait(self, ready, what: str, daemon: str, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.procs[daemon].poll() is not None:
                raise RuntimeError(
                    f"{daemon} exited ({self.procs[daemon].returncode}) while waiting for {what}:\n{self.log_tail()}"
                )
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.log_tail()}")

    def _slurmd(self, i: int) -> None:
        """Node i's slurmd: in its namespace (two nodes), or the host's one node."""
        if not self.net:
            self._daemon("slurmd@1", [_which("slurmd"), "-D"])
            return
        # Not `ip netns exec`: it mounts a fresh /sys, without the cgroup file systems slurmd wants. Only the
        # network namespace, and a private mount namespace for the node's /etc/hosts.
        ns = namespace(i)
        self._daemon(
            f"slurmd@{i}",
            [
                _which("nsenter"),
                f"--net=/run/netns/{ns}",
                _which("unshare"),
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'mount --bind {self.net.hosts} /etc/hosts && exec "$@"',
                "sh",
                _which("slurmd"),
                "-D",
                "-N",
                node_name(i),
            ],
        )

    def _munge(self) -> None:
        d = self.root / "munge"
        d.mkdir()
        d.chmod(0o711)  # munged: only it can list or write here, clients must reach the socket
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        shutil.chown(d, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        self.munge_socket = d / "munge.socket"
        self._daemon(
            "munged",
            [
                _which("munged"),
                "-F",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            user="munge",
        )
        self._wait(self.munge_socket.exists, "munged's socket", "munged")

    def _mariadb(self) -> None:
        d = self.root / "mariadb"
        d.mkdir()
        self.db_port, self.db_socket = free_port(), d / "mysqld.sock"
        self._run(
            [
                _which("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={d / 'data'}",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ]
        )
        self._daemon(
            "mariadb",
            [
                _which("mariadbd"),
                "--no-defaults",
                f"--datadir={d / 'data'}",
                "--user=root",
                f"--socket={self.db_socket}",
                f"--port={self.db_port}",
                "--bind-address=127.0.0.1",
                f"--pid-file={d / 'mysqld.pid'}",
                "--innodb-buffer-pool-size=64M",
            ],
        )
        self._wait(
            lambda: self._ok(
                ["mariadb", "--no-defaults", f"--socket={self.db_socket}", "-u", "root", "-e", "select 1"]
            ),
            "MariaDB",
            "mariadb",
        )
        self.db_password = os.urandom(12).hex()
        sql = (
            "CREATE DATABASE slurm_acct_db; "
            f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_password}'; "
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )
        self._run(["mariadb", "--no-defaults", f"--socket={self.db_socket}", "-u", "root", "-e", sql])

    def _node_lines(self) -> str:
        """``slurmd -C``'s NodeName line per node, memory lowered a little (slurmd drains a node that reports
        less) and shared between the nodes; two nodes by their names and addresses on the test network."""
        line = self._run([_which("slurmd"), "-C"]).splitlines()[0]
        fields = dict(f.split("=", 1) for f in line.split())
        mem = int(int(fields["RealMemory"]) * 0.9 / self.nodes)
        if not self.net:
            return (
                f"NodeName={fields['NodeName']} NodeAddr=127.0.0.1 CPUs={fields['CPUs']} "
                f"RealMemory={mem} State=UNKNOWN\n"
            )
        return "".join(
            f"NodeName={node_name(i)} NodeAddr={node_address(i)} CPUs={fields['CPUs']} RealMemory={mem} State=UNKNOWN\n"
            for i in range(1, self.nodes + 1)
        )

    def _write_configs(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log"):
            (r / sub).mkdir(exist_ok=True)
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        dbd_port, ctld_port, slurmd_port = free_port(), free_port(), free_port()
        self.slurmd_port = slurmd_port
        host = self.controller  # where the nodes (and their jobs) reach slurmctld and slurmdbd
        CONF_DIR.mkdir(exist_ok=True)
        dbd = CONF_DIR / "slurmdbd.conf"
        dbd.touch(mode=0o600)
        dbd.chmod(0o600)  # before the password goes in: slurmdbd refuses a config others can read
        dbd.write_text(
            f"{MARKER}{auth}DbdHost=localhost\nDbdAddr={host}\nDbdPort={dbd_port}\nSlurmUser=root\n"
            f"PidFile={r / 'slurmdbd.pid'}\nLogFile={r / 'log' / 'slurmdbd.log'}\n"
            "StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
            f"StoragePort={self.db_port}\nStorageUser=slurm\nStoragePass={self.db_password}\n"
            "StorageLoc=slurm_acct_db\n"
        )
        self.node = self._node_lines()
        # two slurmds on one machine: a spool folder, pid and log file each (%n: the node's name)
        spool, each = (r / "spool" / "%n", "-%n") if self.net else (r / "spool", "")
        for i in range(1, self.nodes + 1 if self.net else 1):
            (r / "spool" / node_name(i)).mkdir(exist_ok=True)
        self.conf.write_text(
            f"{MARKER}ClusterName={CLUSTER}\nSlurmctldHost=localhost({host})\n{auth}SlurmUser=root\n"
            f"SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={spool}\n"
            f"SlurmctldPidFile={r / 'slurmctld.pid'}\nSlurmdPidFile={r / f'slurmd{each}.pid'}\n"
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}\nSlurmdLogFile={r / 'log' / f'slurmd{each}.log'}\n"
            f"SlurmdTimeout={SLURMD_TIMEOUT_S}\nKillWait={KILL_WAIT_S}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n"
            "JobAcctGatherType=jobacct_gather/none\nReturnToService=2\nMinJobAge=600\n"
            "SchedulerType=sched/backfill\nJobRequeue=1\nAccountingStoreFlags=job_comment\n"
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost={host}\n"
            f"AccountingStoragePort={dbd_port}\n"
            f"AccountingStoragePass={self.munge_socket}\n"  # the munge socket clients use to reach slurmdbd
            f"{self.node}"
            "PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
            "PartitionName=gpu Nodes=ALL MaxTime=INFINITE State=UP\n"
        )

    def _jobs_alive(self) -> bool:
        proc = subprocess.run(["squeue", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=30)
        return proc.returncode == 0 and any(s in proc.stdout for s in ("RUNNING", "COMPLETING", "PENDING"))

    def node_states(self) -> dict[str, str]:
        """Each node's short state as sinfo prints it (idle, alloc, down*, ...)."""
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True, timeout=30
        )
        return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)

    def _node_idle(self) -> bool:
        states = self.node_states()
        return len(states) == self.nodes and all(state == "idle" for state in states.values())

    # --- queries for tests ------------------------------------------------------------
    def steps(self, job_id: str) -> list[dict]:
        """A job's steps (batch, the executor's srun steps, a multi-node launcher's): id, name, tasks, nodes, state,
        node list (SLURM's compressed form)."""
        out = self._run(["sacct", "-j", job_id, "-n", "-P", "-o", "JobIDRaw,JobName%60,NTasks,NNodes,State,NodeList"])
        keys = ("step_id", "name", "tasks", "nodes", "state", "node_list")
        return [dict(zip(keys, line.split("|", 5))) for line in out.splitlines() if line]

    def sacct(self) -> list[dict]:
        """Every job the cluster ran: id, name, state, exit code, nodes, comment (Snakemake's rule and wildcards)."""
        out = self._run(
            [
                "sacct",
                "-X",
                "-n",
                "-P",
                "--starttime=2000-01-01",
                "-o",
                "JobIDRaw,JobName,State,ExitCode,NodeList,Comment%200",
            ]
        )
        keys = ("job_id", "name", "state", "exit_code", "node_list", "comment")
        return [dict(zip(keys, line.split("|", 5))) for line in out.splitlines() if line]
