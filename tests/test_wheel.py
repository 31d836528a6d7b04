"""The shipped templates are found from a built wheel installed into a fresh venv (not only from the tree)."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_in_fresh_venv_renders(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True, text=True)
    wheel = next(dist.glob("clusterddp-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert {"clusterddp/templates/torchrun.sh.j2", "clusterddp/templates/base.sh.j2"} <= set(names)
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "clusterddp").rglob("__init__.py")}
    assert len(packages) > 10 and {f"{p}/__init__.py" for p in packages} <= set(names)  # every folder is shipped

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # click and jinja2 come from this interpreter's site-packages (no network); clusterddp only from the wheel:
    # a .pth line is a plain path entry, so the editable install's own .pth there is not processed.
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("")
    r = subprocess.run([str(venv / "bin" / "clusterddp"), "render", "--nodes", "2", "--gpus", "8", "train.py"],
                       cwd=work, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "--nnodes=2 --nproc-per-node=8" in r.stdout
    where = subprocess.check_output([str(py), "-c", "import clusterddp, clusterddp.backends.slurm.script as r; "
                                     "print(clusterddp.__file__); print(r._shipped_dir())"], cwd=work, text=True)
    module_file, templates = where.split("\n")[:2]
    assert module_file.startswith(str(venv)), module_file
    assert templates.startswith(str(venv)), templates
