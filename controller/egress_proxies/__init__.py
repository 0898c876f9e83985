"""The egress-proxies controller: keeps every Proxy resource backed by a running proxy instance.

Layers import downward only (see docs/architecture.md):
cli -> loop (sweeps, watch, leader election, HTTP) -> reconcile (decisions) -> model;
the two edges, ``kube`` (the only importer of the kubernetes client) and ``runner`` (the
only importer of ansible_runner), sit behind the small interfaces in ``store`` and
``runner.Runner`` so the reconcile logic is tested with fakes and the edges for real.
"""
