"""torchvision `ImageFolder`'s attributes on a `FastLoader`: `classes`, `class_to_idx`, `targets`.

Code written for `DataLoader(ImageFolder(root))` reads these from the dataset (a class-balanced
sampler's weights from `targets`, a report's names from `classes`); a FastLoader over a source
offers them itself, with one meaning for every kind of source (`sources._indexes.targets`):

- `classes`: the source's class names (a tuple; `()` where it names none: integer labels).
  Through a daemon, the welcome's.
- `class_to_idx`: `{name: index}` over `classes` (`{}` where there are none). Through a daemon too.
- `targets`: every sample's target in the source's order (not the epoch's, and with samples an
  `exclude=` list leaves out, as ImageFolder's covers its whole folder; every rank the same), as
  the batches carry it: an int per sample (-1 where a sample has no label), or a list of floats
  per sample for a multi-label source's multi-hot rows. Built on first access, then kept. Local
  only: through a daemon the index lives in the daemon (a million targets are not sent with each
  hello), and a `Dataset`'s targets are its own (`loader.dataset.targets`): both raise
  `TargetsUnavailable`, a ConfigError that says so and an AttributeError (`hasattr` is False).
"""

from __future__ import annotations

import functools

from fastload._errors import TargetsUnavailable
from fastload._loading.assembly import Assembly
from fastload.sources._indexes.targets import class_to_idx, targets_list


class ImageFolderAttributes:
    """`classes`, `class_to_idx` and `targets` of a loader's source (a mixin of `FastLoader`)."""

    _assembly: Assembly

    @property
    def classes(self) -> tuple[str, ...]:
        """The source's class names, in label order (`()` for a source without names, or a Dataset)."""
        return self._assembly.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Each class name to its label, as torchvision's `ImageFolder.class_to_idx`."""
        return class_to_idx(self._assembly.classes)

    @functools.cached_property
    def targets(self) -> list[int] | list[list[float]]:
        """Every sample's target in the source's order, as torchvision's `ImageFolder.targets`
        (built on first access; local sources only: see the module's docstring)."""
        parts = self._assembly
        if parts.spec.daemon is not None:
            raise TargetsUnavailable(
                "targets are read from the source's index, which a daemon holds: open the source in "
                "this process for them: fastload.sources.as_source(loader.dataset).open().labels"
            )
        if parts.index is None:
            raise TargetsUnavailable("a Dataset's targets are its own: read loader.dataset.targets")
        return targets_list(parts.index.labels)
