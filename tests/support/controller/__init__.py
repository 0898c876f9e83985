"""The controller as a test runs it: a child process, fakes of its edges, its discovery server, the command lab."""
