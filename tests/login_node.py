"""An SSH login node for the test cluster: Debian's sshd in the cluster's login namespace (cddp-login,
10.200.0.10; tests/slurm/cluster.sh makes it), throwaway host and user keys, password logins off. Used by
tests/test_remote.py and bench item 11. Root only (network namespaces)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

LOGIN_ADDR = "10.200.0.10"
TCSH_PORT = 2222
PASSWORD_PORT = 2223
HOME_PORT = 2224
PASSWORD = "cddp-test-only"  # root's password on cddp-password only (a file in that sshd's own mount namespace)
NAMESPACE = "cddp-login"
CLUSTER_DIR = os.environ.get("CLUSTERDDP_CLUSTER_DIR", "/tmp/clusterddp-cluster")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "clusterddp-test", "-f", str(path)],
                   check=True)


def start(d: Path) -> Path:
    """Start sshd with keys and configs in ``d``; returns the client's ssh config file, whose hosts are
    cddp-login (the user key), cddp-stranger (a key sshd does not know), cddp-closed (a port nobody
    listens on), cddp-tcsh (root's login shell is tcsh) and cddp-password (root logs in with PASSWORD at a
    prompt). The last two are sshd's of their own, each in a private mount namespace with its own /etc/passwd or
    /etc/shadow: this machine's files are never changed."""
    d.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "id", "stranger"):
        if not (d / name).exists():
            _keygen(d / name)
    (d / "authorized_keys").write_text((d / "id.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"{LOGIN_ADDR} {host_pub[0]} {host_pub[1]}\n"
                                   f"[{LOGIN_ADDR}]:{TCSH_PORT} {host_pub[0]} {host_pub[1]}\n"
                                   f"[{LOGIN_ADDR}]:{PASSWORD_PORT} {host_pub[0]} {host_pub[1]}\n")
    (d / "sshd_config").write_text(f"""ListenAddress {LOGIN_ADDR}
Port 22
HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PidFile {d}/sshd.pid
""")
    common = f"""  User root
  IdentitiesOnly yes
  UserKnownHostsFile {d}/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
"""
    config = d / "ssh_config"
    config.write_text(f"""Host cddp-login
  HostName {LOGIN_ADDR}
  IdentityFile {d}/id
{common}
Host cddp-stranger
  HostName {LOGIN_ADDR}
  IdentityFile {d}/stranger
{common}
Host cddp-closed
  HostName {LOGIN_ADDR}
  Port 2
  IdentityFile {d}/id
{common}
Host cddp-tcsh
  HostName {LOGIN_ADDR}
  Port {TCSH_PORT}
  IdentityFile {d}/id
{common}
Host cddp-password
  HostName {LOGIN_ADDR}
  Port {PASSWORD_PORT}
  User root
  UserKnownHostsFile {d}/known_hosts
  StrictHostKeyChecking yes
  PubkeyAuthentication no
  PreferredAuthentications password
  NumberOfPasswordPrompts 1
""")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    subprocess.run(["nsenter", f"--net=/run/netns/{NAMESPACE}", "/usr/sbin/sshd", "-f", str(d / "sshd_config"),
                    "-E", str(d / "sshd.log")], check=True)
    # root's login shell is tcsh there (sshd runs commands with the user's passwd shell).
    _variant(d, "tcsh", TCSH_PORT, {"/etc/passwd": _root_field(Path("/etc/passwd"), 6, "/usr/bin/tcsh")}, {})
    # root logs in with a password there, typed at a prompt (keys off).
    hashed = subprocess.run(["openssl", "passwd", "-6", PASSWORD], capture_output=True, text=True, check=True)
    _variant(d, "password", PASSWORD_PORT, {"/etc/shadow": _root_field(Path("/etc/shadow"), 1, hashed.stdout.strip())},
             {"PasswordAuthentication no": "PasswordAuthentication yes", "PermitRootLogin prohibit-password":
              "PermitRootLogin yes", "AuthorizedKeysFile {d}/authorized_keys".format(d=d): "AuthorizedKeysFile none"})
    deadline = time.monotonic() + 20
    for host, log, ready in (("cddp-login", "sshd.log", ""), ("cddp-tcsh", "sshd-tcsh.log", ""),
                             ("cddp-password", "sshd-password.log", "Permission denied")):
        while True:
            proc = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", host, "true"],
                                  capture_output=True, text=True)
            if (proc.returncode == 0) if not ready else ready in proc.stderr:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on the login node ({host}) did not answer: "
                                   + (d / log).read_text()[-2000:])
            time.sleep(0.2)
    return config


def start_home(d: Path, config: Path, home: Path, environment: Dict[str, str]) -> str:
    """Another sshd of the login node (host cddp-home in ``config``) where root's home is ``home`` (a real
    directory, or a link to one, as /home/alice -> /gpfs/home/alice) and the site's environment is
    ``environment`` (~/.ssh/environment there, as a site's login profile would give it: no setup lines needed).
    Returns the host name."""
    ssh = Path(os.path.realpath(home)) / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh / "environment").write_text("".join(f"{k}={v}\n" for k, v in environment.items()))
    _variant(d, "home", HOME_PORT, {"/etc/passwd": _root_field(Path("/etc/passwd"), 5, str(home))},
             {"UsePAM no": "UsePAM no\nPermitUserEnvironment yes"})
    host_pub = (d / "host_key.pub").read_text().split()
    with open(d / "known_hosts", "a") as fh:
        fh.write(f"[{LOGIN_ADDR}]:{HOME_PORT} {host_pub[0]} {host_pub[1]}\n")
    with open(config, "a") as fh:
        fh.write(f"Host cddp-home\n  HostName {LOGIN_ADDR}\n  Port {HOME_PORT}\n  IdentityFile {d}/id\n  User root\n"
                 f"  IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n  StrictHostKeyChecking yes\n"
                 "  BatchMode yes\n")
    deadline = time.monotonic() + 20
    while subprocess.run(["ssh", "-F", str(config), "cddp-home", "true"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("sshd with its own home did not answer: " + (d / "sshd-home.log").read_text()[-2000:])
        time.sleep(0.2)
    return "cddp-home"


def _root_field(path: Path, index: int, value: str) -> str:
    """``path`` (passwd or shadow) with field ``index`` of root's line set to ``value``."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("root:"):
            fields = line.split(":")
            fields[index] = value
            line = ":".join(fields)
        lines.append(line + "\n")
    return "".join(lines)


def _variant(d: Path, name: str, port: int, files: Dict[str, str], config: Dict[str, str]) -> None:
    """Another sshd of the login node on ``port``, in a private mount namespace where ``files`` (path -> text)
    replace the machine's own (which stay untouched), with ``config`` replacements in its sshd_config."""
    text = (d / "sshd_config").read_text().replace("Port 22\n", f"Port {port}\n").replace("sshd.pid",
                                                                                         f"sshd-{name}.pid")
    for old, new in config.items():
        assert old in text, old
        text = text.replace(old, new)
    (d / f"sshd_config_{name}").write_text(text)
    mounts = []
    for target, content in files.items():
        source = d / f"{name}-{Path(target).name}"
        source.write_text(content)
        source.chmod(0o600)
        mounts.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
    start = shlex.join(["nsenter", f"--net=/run/netns/{NAMESPACE}", "/usr/sbin/sshd", "-f",
                        str(d / f"sshd_config_{name}"), "-E", str(d / f"sshd-{name}.log")])
    subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    " && ".join(mounts + [f"exec {start}"])], check=True)


def stop() -> None:
    """End sshd and every session of the login node (the shared connections end with them)."""
    pids = subprocess.run(["ip", "netns", "pids", NAMESPACE], capture_output=True, text=True).stdout.split()
    for pid in pids:
        subprocess.run(["kill", "-9", pid], capture_output=True)


def cluster_table(name: str, host: str, config: Path, remote_home: Path) -> str:
    """A [clusters.NAME] for the test cluster through this login node: Slurm's configuration and this Python
    environment (with torch) come from the setup lines, as `module load` would give them on a real cluster."""
    # ($CLUSTER_DIR/bin holds the clients of a Slurm release that runs in its own root: tests/slurm/cluster.sh.)
    setup = [f"export SLURM_CONF={CLUSTER_DIR}/slurm.conf",
             f"export PATH={CLUSTER_DIR}/bin:{Path(sys.executable).parent}:$PATH"]
    return (f'[clusters.{name}]\nhost = "{host}"\nssh_config = "{config}"\nremote_dir = "{remote_home}/clusterddp"\n'
            "setup = [" + ", ".join(f'"{line}"' for line in setup) + "]\n")
