"""The collection as a test runs it: modules through the runner, the built artifact, provider
config files, the config documents the config tests break."""
