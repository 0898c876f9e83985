# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the provider config is read: typed fields with their field path, every error collected.

``config.py`` reads the file's root and each provider entry with these; each provider type's
``settings.py`` reads its own section with them. A reader's getters raise ``ConfigError`` for
their one field, and ``Errors.read`` records it and goes on, so one bad field never hides the
next. Importable without Ansible and without any provider's SDK: only the standard library and
the collection's errors module.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent

# Paths inside the file are opened by the modules, whose working directory is a private
# run directory of ansible-runner, never the operator's: a relative path would silently
# name a file somewhere else (or nowhere).
ABSOLUTE_PATH_RULE = ("must be an absolute path (starting with /): the modules run in a working directory of "
                      "their own, not the one you wrote the file in")

T = TypeVar("T")


class ConfigError(Permanent):
    """The provider config is invalid; the message names the field path(s).

    ``errors`` holds each error on its own (the message joins them), so callers that
    print a report can list them one per line.
    """

    def __init__(self, message: str, errors: Optional[Sequence[str]] = None) -> None:
        super().__init__(message)
        self.errors: List[str] = list(errors) if errors else [message]


def joined(errors: Sequence[str]) -> str:
    """One message for several errors; numbered, because the errors themselves contain ';'."""
    if len(errors) == 1:
        return errors[0]
    return "%d errors: %s" % (len(errors), " ".join("(%d) %s;" % (n, e) for n, e in enumerate(errors, 1))[:-1])


class Errors:
    """Collects errors instead of stopping at the first: each field is read through ``read``."""

    def __init__(self) -> None:
        self.messages: List[str] = []
        # Errors that keep one location (a KVM host) from new proxies, not the whole section: the
        # section stays usable at run time, but a check of the file still refuses them.
        self.locations: List[str] = []

    def __len__(self) -> int:
        return len(self.messages)

    def add(self, message: str) -> None:
        self.messages.append(message)

    def read(self, reader: Callable[..., T], *args: Any, **kwargs: Any) -> Optional[T]:
        """``reader(*args, **kwargs)``, or None with its error recorded."""
        try:
            return reader(*args, **kwargs)
        except ConfigError as error:
            self.messages.extend(error.errors)
            return None


class Reader:
    """Typed access to one mapping of the YAML document, with its field path.

    The typed getters raise ConfigError for their one field; callers read each field
    through ``Errors.read`` so one bad field never hides the next."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError("%s: must be a mapping, got %s" % (path or "<document>", kind_of(data)))
        self.data: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return "%s.%s" % (self.path, key) if self.path else key

    def only(self, errors: Errors, *allowed: str) -> None:
        """Every unknown key is an error of its own."""
        for key in self.data:
            if key not in allowed:
                errors.add("%s: unknown field; allowed fields here are %s" % (self.at(str(key)), ", ".join(allowed)))

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str, default: Optional[str] = None, pattern: Optional[re.Pattern[str]] = None,
               rule: str = "") -> str:
        value = self.data.get(key)
        if value is None:
            if default is not None:
                return default
            raise ConfigError("%s: required field is missing" % self.at(key))
        if not isinstance(value, str) or not value:
            raise ConfigError("%s: must be a non-empty string, got %s" % (self.at(key), kind_of(value)))
        if pattern is not None and not pattern.fullmatch(value):
            raise ConfigError("%s: %r %s" % (self.at(key), value, rule))
        return value

    def optional_string(self, key: str) -> Optional[str]:
        if self.data.get(key) is None:
            return None
        return self.string(key)

    def absolute_path(self, key: str, required: bool, pattern: Optional[re.Pattern[str]] = None,
                      rule: str = "") -> Optional[str]:
        """A file path the modules open: absolute, because their working directory is not yours."""
        if not required and self.data.get(key) is None:
            return None
        value = self.string(key, pattern=pattern, rule=rule)
        if not value.startswith("/"):
            raise ConfigError("%s: %r %s" % (self.at(key), value, ABSOLUTE_PATH_RULE))
        return value

    def choice(self, key: str, choices: Tuple[str, ...], default: Optional[str] = None) -> str:
        value = self.string(key, default)
        if value not in choices:
            raise ConfigError("%s: %r is not one of %s" % (self.at(key), value, ", ".join(choices)))
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError("%s: must be true or false, got %s" % (self.at(key), kind_of(value)))
        return value

    def integer(self, key: str, minimum: int) -> int:
        value = self.data.get(key)
        if value is None:
            raise ConfigError("%s: required field is missing" % self.at(key))
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError("%s: must be an integer >= %d, got %r" % (self.at(key), minimum, value))
        return value

    def mapping(self, key: str) -> "Reader":
        if key not in self.data or self.data[key] is None:
            raise ConfigError("%s: required field is missing" % self.at(key))
        return Reader(self.data[key], self.at(key))

    def non_empty_mapping(self, key: str) -> Dict[Any, Any]:
        reader = self.mapping(key)
        if not reader.data:
            raise ConfigError("%s: must have at least one entry" % self.at(key))
        return dict(reader.data)

    def non_empty_list(self, key: str) -> List[Any]:
        value = self.data.get(key)
        if value is None:
            raise ConfigError("%s: required field is missing" % self.at(key))
        if not isinstance(value, list) or not value:
            raise ConfigError("%s: must be a non-empty list, got %s" % (self.at(key), kind_of(value)))
        return value

    def keys_as_written(self, key: str) -> Dict[str, Any]:
        """The keys of a mapping field as written (empty when it is missing or not a mapping)."""
        value = self.data.get(key)
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def kind_of(value: Any) -> str:
    """What a wrong value is, for messages: its type, and the value itself when it is a scalar."""
    if value is None:
        return "nothing"
    return "%s %r" % (type(value).__name__, value) if isinstance(value, (int, float, str, bool)) else type(
        value).__name__


def default_key(reader: Reader, key: str, keys: Dict[str, Any], what: str) -> str:
    """A default* field must name one of the keys it picks from."""
    if not reader.has(key):
        if len(keys) == 1:
            return next(iter(keys))
        raise ConfigError("%s: required when more than one %s is configured" % (reader.at(key), what))
    value = reader.string(key)
    if value not in keys:
        raise ConfigError(
            "%s: %r is not a key of %s (keys: %s)" % (reader.at(key), value, what, ", ".join(sorted(keys)))
        )
    return value
