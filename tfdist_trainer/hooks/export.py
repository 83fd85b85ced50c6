"""ExportSavedModel: one SavedModel with a serving signature at the end of training."""

from __future__ import annotations

import gin

from tfdist_trainer.errors import StorageError
from tfdist_trainer.hooks.base import Hook
from tfdist_trainer.io import storage


@gin.configurable
class ExportSavedModel(Hook):
    """Exports a SavedModel with a serving signature at the end (chief only)."""

    def __init__(self, export_dir: str | None = None):
        self.export_dir = export_dir

    def end(self, run):
        if not run.cluster.is_chief:
            return
        path = self.export_dir or storage.join(run.model_dir, "export", str(run.step))
        try:
            run.export_saved_model(path)
        except storage.write_errors() as e:
            message = (getattr(e, "message", None) or str(e)).strip().splitlines()[0]
            raise StorageError(
                f"ExportSavedModel could not write {path} ({message}); the checkpoint of step "
                f"{run.step} is saved; pick another ExportSavedModel.export_dir."
            ) from None
