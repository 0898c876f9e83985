"""The Compute Engine REST emulator and the VPC firewall it keeps and applies."""
