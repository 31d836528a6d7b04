"""On PYTHONPATH only for tests/test_migrate.py's runs of the scripts in published shapes (offline, on the CPU; see
tests/offline_data.py). Two things this machine needs that a user's would not:

- The registry's torchvision wheel is a CUDA build: its C operators do not load against the CPU torch (importing it
  fails registering ``torchvision::nms``). Its pure-Python parts (datasets, transforms, models) work once its
  fake-kernel registrations are skipped, which is all these scripts use.
- The fake CIFAR-10 files cannot match the real archive's MD5 sums, which torchvision checks before it reads them:
  for CIFAR only, a file that exists is taken as it is (the rest of torchvision's reader runs unchanged).
"""
import importlib.abc
import importlib.machinery
import os
import sys
import types

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


class _ExistsIsEnough(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torchvision.datasets.cifar":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.check_integrity = lambda fpath, md5=None: os.path.isfile(fpath)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _ExistsIsEnough())
