"""A one-node SLURM cluster on this machine, with accounting, for `make test-cluster`.

Everything but the two config files lives in one private folder: a MariaDB server on a
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
reports. Partitions ``cpu`` and ``gpu`` (the names cluster/config.yaml uses) both hold
the one node, which has no GPUs: the test asks for ``gpu=0``.

Needs root (slurmd runs jobs as their user; SlurmUser is root) and Debian's
``slurm-wlm slurmdbd munge mariadb-server``; :func:`unavailable` says why not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from conftest import free_port

PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server")
BINARIES = ("slurmctld", "slurmd", "slurmdbd", "sacctmgr", "sbatch", "sacct", "munged", "mariadbd",
            "mariadb-install-db", "mariadb")
CLUSTER = "locvit"
CONF_DIR = Path("/etc/slurm")
MARKER = "# written by locvit's tests/slurm_cluster.py; removed when its cluster stops\n"


def node_overrides(runtimes: dict[str, int] | None = None, default_runtime: int = 30,
                   train_extra: str | None = None) -> list[str]:
    """Snakemake flags fitting every sized rule of cluster/config.yaml to the one 2-CPU node without a GPU.

    They replace the profile's default-resources, set-resources and set-threads: 1 CPU, 2 GB and no GPU
    a job, a rule's runtime from ``runtimes`` (minutes, else ``default_runtime``). train and search_train,
    sized by the study's resources rather than the profile, are overridden too, nodes included: a
    multi-node variant's tasks share the one node. ``train_extra`` replaces train's slurm_extra.
    """
    import yaml

    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "cluster" / "config.yaml").read_text())
    runtimes = runtimes or {}
    trainers = ("train", "search_train")
    sized = profile["set-resources"]
    resources = [f"{rule}:{key}={value}" for rule, sizes in sized.items()
                 for key, value in (("gpu", 0), ("cpus_per_task", 1), ("mem_mb", 2000),
                                    ("runtime", runtimes.get(rule, default_runtime)))
                 if key in sizes or rule in trainers]
    resources += [f"{rule}:nodes=1" for rule in trainers]
    resources += [f"{rule}:slurm_extra={sizes['slurm_extra']}" for rule, sizes in sized.items()
                  if "slurm_extra" in sizes and not (rule == "train" and train_extra)]
    if train_extra:
        resources.append(f"train:slurm_extra={train_extra}")
    return ["--default-resources", "slurm_partition=cpu", "mem_mb=1500", f"runtime={default_runtime}",
            "cpus_per_task=1", "--set-resources", *resources,
            "--set-threads", *[f"{rule}=1" for rule in profile["set-threads"]]]


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
        return (f"missing {', '.join(missing)}: install Debian's {' '.join(PACKAGES)} "
                "(`make test-cluster` does, as root with apt-get)")
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


class LocalSlurm:
    """Start with :meth:`start`, always :meth:`stop`. ``env`` is what clients (sbatch, Snakemake) need."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="locvit-slurm-"))
        self.root.chmod(0o755)  # munged (user munge) must reach its own folder inside
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = CONF_DIR / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # --- life cycle -------------------------------------------------------------------
    def start(self) -> "LocalSlurm":
        try:
            self._munge()
            self._mariadb()
            self._write_configs()
            self._daemon("slurmdbd", [_which("slurmdbd"), "-D"])
            self._wait(lambda: self._ok(["sacctmgr", "-n", "list", "cluster"]), "slurmdbd to answer", "slurmdbd")
            self._run(["sacctmgr", "-i", "add", "cluster", CLUSTER])
            self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i"])
            self._daemon("slurmd", [_which("slurmd"), "-D"])
            self._wait(self._node_idle, "the node to come up idle", "slurmd")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End every daemon (slurmd first, MariaDB last) and remove the folder."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--partition=cpu,gpu"], env=self.env, capture_output=True,
                           timeout=30)
            end = time.monotonic() + 30
            while time.monotonic() < end and self._jobs_alive():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadb", "munged"):
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
        for name in ("slurm.conf", "slurmdbd.conf"):
            if _ours(CONF_DIR / name):
                (CONF_DIR / name).unlink()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalSlurm":
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
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n"
                               f"{self.log_tail()}")
        return proc.stdout

    def _ok(self, cmd: list[str]) -> bool:
        return subprocess.run(cmd, env=self.env, capture_output=True, timeout=60).returncode == 0

    def _daemon(self, name: str, cmd: list[str], user: str | None = None) -> None:
        (self.root / "log").mkdir(exist_ok=True)
        out = open(self.root / "log" / f"{name}.out.log", "w")
        if user:
            cmd = ["runuser", "-u", user, "--", *cmd]
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def _wait(self, ready, what: str, daemon: str, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.procs[daemon].poll() is not None:
                raise RuntimeError(f"{daemon} exited ({self.procs[daemon].returncode}) while waiting for {what}:\n"
                                   f"{self.log_tail()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.log_tail()}")

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
        self._daemon("munged", [_which("munged"), "-F", f"--key-file={key}", f"--socket={self.munge_socket}",
                                f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                                f"--seed-file={d / 'munged.seed'}"], user="munge")
        self._wait(self.munge_socket.exists, "munged's socket", "munged")

    def _mariadb(self) -> None:
        d = self.root / "mariadb"
        d.mkdir()
        self.db_port, self.db_socket = free_port(), d / "mysqld.sock"
        self._run([_which("mariadb-install-db"), "--no-defaults", f"--datadir={d / 'data'}", "--user=root",
                   "--auth-root-authentication-method=socket", "--skip-test-db"])
        self._daemon("mariadb", [_which("mariadbd"), "--no-defaults", f"--datadir={d / 'data'}", "--user=root",
                                 f"--socket={self.db_socket}", f"--port={self.db_port}", "--bind-address=127.0.0.1",
                                 f"--pid-file={d / 'mysqld.pid'}", "--innodb-buffer-pool-size=64M"])
        self._wait(lambda: self._ok(["mariadb", "--no-defaults", f"--socket={self.db_socket}", "-u", "root",
                                     "-e", "select 1"]), "MariaDB", "mariadb")
        self.db_password = os.urandom(12).hex()
        sql = ("CREATE DATABASE slurm_acct_db; "
               f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_password}'; "
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        self._run(["mariadb", "--no-defaults", f"--socket={self.db_socket}", "-u", "root", "-e", sql])

    def _node_line(self) -> str:
        """``slurmd -C``'s NodeName line, memory lowered a little (slurmd drains a node that reports less)."""
        line = self._run([_which("slurmd"), "-C"]).splitlines()[0]
        fields = dict(f.split("=", 1) for f in line.split())
        mem = int(int(fields["RealMemory"]) * 0.9)
        return (f"NodeName={fields['NodeName']} NodeAddr=127.0.0.1 CPUs={fields['CPUs']} "
                f"RealMemory={mem} State=UNKNOWN")

    def _write_configs(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log"):
            (r / sub).mkdir(exist_ok=True)
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        dbd_port, ctld_port, slurmd_port = free_port(), free_port(), free_port()
        CONF_DIR.mkdir(exist_ok=True)
        dbd = CONF_DIR / "slurmdbd.conf"
        dbd.touch(mode=0o600)
        dbd.chmod(0o600)  # before the password goes in: slurmdbd refuses a config others can read
        dbd.write_text(
            f"{MARKER}{auth}DbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={dbd_port}\nSlurmUser=root\n"
            f"PidFile={r / 'slurmdbd.pid'}\nLogFile={r / 'log' / 'slurmdbd.log'}\n"
            "StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
            f"StoragePort={self.db_port}\nStorageUser=slurm\nStoragePass={self.db_password}\n"
            "StorageLoc=slurm_acct_db\n")
        self.node = self._node_line()
        self.conf.write_text(
            f"{MARKER}ClusterName={CLUSTER}\nSlurmctldHost=localhost(127.0.0.1)\n{auth}SlurmUser=root\n"
            f"SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={r / 'spool'}\n"
            f"SlurmctldPidFile={r / 'slurmctld.pid'}\nSlurmdPidFile={r / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}\nSlurmdLogFile={r / 'log' / 'slurmd.log'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n"
            "JobAcctGatherType=jobacct_gather/none\nReturnToService=2\nMinJobAge=600\n"
            "SchedulerType=sched/backfill\nJobRequeue=1\nAccountingStoreFlags=job_comment\n"
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={dbd_port}\n"
            f"AccountingStoragePass={self.munge_socket}\n"  # the munge socket clients use to reach slurmdbd
            f"{self.node}\n"
            "PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
            "PartitionName=gpu Nodes=ALL MaxTime=INFINITE State=UP\n")

    def _jobs_alive(self) -> bool:
        proc = subprocess.run(["squeue", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=30)
        return proc.returncode == 0 and any(s in proc.stdout for s in ("RUNNING", "COMPLETING", "PENDING"))

    def _node_idle(self) -> bool:
        proc = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True, timeout=30)
        return proc.returncode == 0 and "idle" in proc.stdout

    # --- queries for tests ------------------------------------------------------------
    def steps(self, job_id: str) -> list[dict]:
        """A job's steps (batch, the executor's srun steps, a multi-node launcher's): id, name, tasks, nodes, state."""
        out = self._run(["sacct", "-j", job_id, "-n", "-P", "-o", "JobIDRaw,JobName%60,NTasks,NNodes,State"])
        keys = ("step_id", "name", "tasks", "nodes", "state")
        return [dict(zip(keys, line.split("|", 4))) for line in out.splitlines() if line]

    def sacct(self) -> list[dict]:
        """Every job the cluster ran: id, name, state, exit code, comment (Snakemake's rule and wildcards)."""
        out = self._run(["sacct", "-X", "-n", "-P", "--starttime=2000-01-01", "-o",
                         "JobIDRaw,JobName,State,ExitCode,Comment%200"])
        keys = ("job_id", "name", "state", "exit_code", "comment")
        return [dict(zip(keys, line.split("|", 4))) for line in out.splitlines() if line]
