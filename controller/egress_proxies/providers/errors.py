"""How a provider operation failed (docs/contract.md, "Error classes"): the one definition of the
error classes on the controller's side, used by the runner (a run that gave no result) and by the
provider client (a module's own ``error_class``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ErrorClass(enum.StrEnum):
    """The contract's error classes; anything unclassified is transient."""

    NOT_FOUND = "not_found"
    PERMANENT = "permanent"
    TRANSIENT = "transient"

    @classmethod
    def of(cls, value: object) -> ErrorClass:
        """The class a module (or a run) reported; anything else is transient (the contract's default)."""
        try:
            return cls(str(value or "transient"))
        except ValueError:
            return cls.TRANSIENT


@dataclass(frozen=True)
class ProviderError:
    error_class: ErrorClass
    message: str

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message}"
