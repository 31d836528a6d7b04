"""An SSH login node for the test cluster: Debian's sshd in the cluster's login namespace (cddp-login,
10.200.0.10; tests/slurm/cluster.sh makes it), throwaway host and user keys, password logins off. Used by
tests/test_remote.py and bench item 11. Root only (network namespaces)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

LOGIN_ADDR = "10.200.0.10"
TCSH_PORT = 2222
NAMESPACE = "cddp-login"
CLUSTER_DIR = os.environ.get("CLUSTERDDP_CLUSTER_DIR", "/tmp/clusterddp-cluster")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "clusterddp-test", "-f", str(path)],
                   check=True)


def start(d: Path) -> Path:
    """Start sshd with keys and configs in ``d``; returns the client's ssh config file, whose hosts are
    cddp-login (the user key), cddp-stranger (a key sshd does not know), cddp-closed (a port nobody
    listens on) and cddp-tcsh (a second sshd, on port 2222, whose root has tcsh as login shell)."""
    d.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "id", "stranger"):
        if not (d / name).exists():
            _keygen(d / name)
    (d / "authorized_keys").write_text((d / "id.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"{LOGIN_ADDR} {host_pub[0]} {host_pub[1]}\n"
                                   f"[{LOGIN_ADDR}]:{TCSH_PORT} {host_pub[0]} {host_pub[1]}\n")
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
""")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    subprocess.run(["nsenter", f"--net=/run/netns/{NAMESPACE}", "/usr/sbin/sshd", "-f", str(d / "sshd_config"),
                    "-E", str(d / "sshd.log")], check=True)
    # The tcsh login node: the same sshd on another port, in a private mount namespace whose /etc/passwd gives
    # root /usr/bin/tcsh (sshd runs commands with the user's passwd shell); this machine's own file is untouched.
    (d / "passwd-tcsh").write_text("".join(
        ":".join(f.split(":")[:6] + ["/usr/bin/tcsh"]) + "\n" if f.startswith("root:") else f + "\n"
        for f in Path("/etc/passwd").read_text().splitlines()))
    (d / "sshd_config_tcsh").write_text((d / "sshd_config").read_text().replace("Port 22\n", f"Port {TCSH_PORT}\n")
                                        .replace("sshd.pid", "sshd-tcsh.pid"))
    subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount --bind "$1" /etc/passwd && exec nsenter --net="$2" /usr/sbin/sshd -f "$3" -E "$4"',
                    "login-tcsh", str(d / "passwd-tcsh"), f"/run/netns/{NAMESPACE}", str(d / "sshd_config_tcsh"),
                    str(d / "sshd-tcsh.log")], check=True)
    deadline = time.monotonic() + 20
    for host, log in (("cddp-login", "sshd.log"), ("cddp-tcsh", "sshd-tcsh.log")):
        while subprocess.run(["ssh", "-F", str(config), host, "true"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on the login node ({host}) did not answer: "
                                   + (d / log).read_text()[-2000:])
            time.sleep(0.2)
    return config


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
