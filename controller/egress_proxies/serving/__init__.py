"""Is each proxy serving, and who may use it: probing through every proxy (``monitor``, ``probe``)
and the credentials instances are built with (``credentials``)."""
