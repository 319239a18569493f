"""What storing a plan decided and measured: the manifest's ``data`` object and the exchange's figures."""
from __future__ import annotations

from dataclasses import dataclass

SECONDS = ("read", "exchange", "spill", "write")  # where the store's time went, in this order


@dataclass(frozen=True)
class ExchangeStats:
    """How the rows moved: rounds, the memory budget, spills over all ranks, and seconds (max over ranks).

    It varies with the rank count, so ``write_index`` keeps it in the provenance (out of ``content_hash``).
    """

    rounds: int
    memory_limit: int
    round_budget: int
    spills: int
    spill_batches: int
    seconds: dict[str, float]

    def as_dict(self) -> dict:
        """Return the manifest's ``provenance.exchange`` object."""
        return {"rounds": self.rounds, "memory_limit": self.memory_limit, "round_budget": self.round_budget,
                "spills": self.spills, "spill_batches": self.spill_batches, "seconds": dict(self.seconds)}


@dataclass
class StoreResult:
    """The data shards a plan's store wrote (the manifest's ``data``) and how its rows moved (``exchange``)."""

    columns: list[str]
    schema: dict[str, str]  # column name: Arrow type
    rows_per_shard: int
    num_rows: int
    shards: list[dict]
    exchange: ExchangeStats
    tokens: dict | None = None  # --store-tokens: where the ids come from
    pieces: list[str] | None = None  # --oversize split: the stored columns cut to a piece's range

    def manifest_data(self) -> dict:
        """Return the manifest's ``data`` object (covered by ``content_hash``)."""
        data = {"columns": self.columns, "schema": self.schema, "rows_per_shard": self.rows_per_shard,
                "num_rows": self.num_rows, "shards": self.shards}
        if self.tokens is not None:
            data["tokens"] = self.tokens
        if self.pieces is not None:
            data["pieces"] = {"cut": self.pieces}
        return data
