"""The egress-proxies controller: keeps every Proxy resource backed by a running proxy instance.

One sub-package per stage, imports running downward only (docs/architecture.md, "The
controller"; checked by import-linter, pyproject.toml): the process (``cli``, ``loop``,
``http_server``, ``leader``, ``health``) -> ``sweep`` -> ``serving`` | ``sources`` ->
``providers`` -> ``resources``, with ``metrics`` and ``logs`` as leaves. The two edges sit behind
one module each: ``sources.kube`` (the only importer of the kubernetes client) and
``providers.runner`` (the only importer of ansible_runner).
"""
