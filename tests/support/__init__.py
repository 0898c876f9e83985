"""The test kit: real parts for the tests, the benchmarks and the demo, by subject.

- ``kube/``: the Kubernetes API emulator (API server, resources, validation, admission,
  selectors, patches, paging, watches, its HTTP handler);
- ``compute/``: the Compute Engine REST emulator and its VPC firewall;
- ``hosts/``: the KVM side: libvirtd on the test driver, a hypervisor host (libvirtd behind
  sshd in a network namespace), a VM to bootstrap, a guest's agent;
- ``netns/``: a test's network namespace and what runs inside it: squid, origin and DNS
  servers, fake proxies, the probe target, a banning site, a kubelet that runs Pods as squids;
- ``images/``: what is built once per machine and cached: guest images, the controller's
  container image, a Debian package repository;
- ``collection/``: the collection as a test runs it: its modules through the runner, its built
  artifact, provider config files and the config documents the config tests break;
- ``controller/``: the controller as a child process, its fakes, its discovery server, the
  command lab;
- ``process.py``: the process toolkit (start-up errors, readiness probes, log tails, stopping
  process groups and namespaces); ``waiting.py``: the one way to wait; ``figures.py``: the one
  way to show measured figures.
"""

from pathlib import Path

# The repository's root (this file is tests/support/__init__.py).
REPO = Path(__file__).resolve().parents[2]
