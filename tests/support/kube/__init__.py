"""The Kubernetes API emulator, by concern: the server (``emulator``), its HTTP ``handler``,
``resources``, ``errors``, ``selectors``, ``patches``, ``paging``, ``watch``, ``validation`` and
``admission``."""
