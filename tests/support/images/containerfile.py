"""controller/Containerfile read as the builder reads it: stages, their instructions, ARG defaults."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field


@dataclass
class Stage:
    base: str  # as written, e.g. ${BASE}
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        return _assignments(self.all("ENV"))

    def labels(self) -> dict[str, str]:
        return _assignments(self.all("LABEL"))

    def apt_packages(self) -> list[str]:
        packages = []
        for command in self.all("RUN"):
            for part in command.split("&&"):
                words = shlex.split(part)
                if "apt-get" in words and "install" in words:
                    packages += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
        return packages


@dataclass
class Containerfile:
    global_args: dict[str, str]  # ARGs before the first FROM, with their defaults
    stages: list[Stage]

    def base(self, stage: Stage) -> str:
        """A stage's base image with the global ARG defaults substituted (what a plain build uses)."""
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.global_args[m.group(1) or m.group(2)], stage.base)


def _assignments(lines: list[str]) -> dict[str, str]:
    result = {}
    for args in lines:
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            result[key] = value
    return result


def parse(text: str) -> Containerfile:
    """Instructions per stage: continuation lines joined, comment lines dropped (as the builder does)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    logical = ""
    for line in text.splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        logical += line.rstrip().removesuffix("\\") + " "
        if line.rstrip().endswith("\\"):
            continue
        keyword, _, args = logical.strip().partition(" ")
        logical = ""
        args = " ".join(args.split())
        if keyword.upper() == "FROM":
            words = args.split()
            stages.append(Stage(words[0], words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
        elif not stages:
            assert keyword.upper() == "ARG", f"only ARG may come before the first FROM, not {keyword}"
            name, _, default = args.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append((keyword.upper(), args))
    return Containerfile(global_args, stages)
