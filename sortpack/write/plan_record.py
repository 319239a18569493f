"""What a plan's manifest records besides its rows: the options, the source files, how the job ran, more keys."""
from __future__ import annotations

from typing import NamedTuple

from ..stages.plan_options import PlanOptions
from .provenance import JobInfo, Profile


class PlanRecord(NamedTuple):
    """What a plan's manifest records besides its rows and shards.

    ``options``: the plan's options (``PlanOptions.to_manifest`` is the manifest's ``options``);
    ``files``: the source fingerprint (their locations go to the provenance); ``profile`` and
    ``job``: how the job ran (the provenance, out of ``content_hash``); ``extra``: more manifest
    keys, covered by ``content_hash`` (a mixture's ``mixture``, a plan's ``holdout``).
    """

    options: PlanOptions
    files: list[dict]
    profile: Profile
    job: JobInfo
    extra: dict | None = None

    @property
    def source_rows(self) -> int:
        """Return the rows of the source files together."""
        return int(sum(int(f["rows"]) for f in self.files))
