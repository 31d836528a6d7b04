"""``clusterddp migrate``: a DataParallel training script rewritten for DDP with clusterddp's runtime (LibCST, on
use: comments and formatting kept, untouched lines byte for byte), and the list of what it cannot rewrite safely.

``rules`` holds the rewrite and the survey (what is there, what is not safe to touch); ``check`` runs the result
here as 2 emulated nodes x 2 ranks and says whether it trained and how the ranks' data differed.
"""
from __future__ import annotations

from .rules import Migration, migrate_source

__all__ = ["Migration", "migrate_source"]
