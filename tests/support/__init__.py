"""Test-only helpers that start real libvirt daemons (and an SSH-reachable hypervisor host)."""
