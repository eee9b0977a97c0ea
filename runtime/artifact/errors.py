"""The one exception type a damaged or invalid artifact may raise.

Every check in the container code raises `ArtifactError` with a short rule identifier (the
validation rule that failed) and, where one exists, the object, binding or file concerned, so a
user can tell what is wrong without reading a traceback.
"""

from __future__ import annotations


class ArtifactError(Exception):
    """An artifact (or one of its parts) breaks a rule of the container specification."""

    def __init__(
        self,
        rule: str,
        message: str,
        *,
        obj: str | None = None,
        path: str | None = None,
    ) -> None:
        self.rule = rule
        self.obj = obj
        self.path = path
        self.detail = message
        where = []
        if path is not None:
            where.append(str(path))
        if obj is not None:
            where.append(f"object {obj!r}")
        prefix = f"{': '.join(where)}: " if where else ""
        super().__init__(f"{prefix}[{rule}] {message}")
