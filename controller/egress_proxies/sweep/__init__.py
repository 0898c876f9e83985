"""One sweep over every Proxy and ProxyPool: decide, then write (``reconcile.Reconciler.sweep``).

Imports ``serving``, ``sources``, ``providers`` and ``resources``; imported by the process only."""
