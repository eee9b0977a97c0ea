"""The `.ninfer` container, framing v3: reader, writer, validator, formats and layouts.

A leaf package (numpy and ml_dtypes only) shared by the compiler and the runtime.
"""

from .directory import Binding, Component, Directory, Part, ResourceObject, TensorObject, Use
from .errors import ArtifactError
from .reader import Artifact, open_artifact
from .writer import ArtifactWriter

__all__ = [
    "Artifact",
    "ArtifactError",
    "ArtifactWriter",
    "Binding",
    "Component",
    "Directory",
    "Part",
    "ResourceObject",
    "TensorObject",
    "Use",
    "open_artifact",
]
