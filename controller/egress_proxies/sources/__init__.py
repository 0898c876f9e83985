"""Where Proxies and ProxyPools come from and where their status goes: the interfaces (``store``),
the Kubernetes API (``kube``, the only importer of the kubernetes client) and a directory of YAML
files (``directory``, ``directory_pools``)."""
