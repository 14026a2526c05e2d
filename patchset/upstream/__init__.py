"""Following upstream: the audit of each patch's pull request against what the registry
records (`audit`, `patchset upstream`) and the pins that follow vLLM's releases (`bump`)."""

from patchset.upstream.audit import (
    ATTENTION,
    JOBS,
    SCHEMA,
    AuditStatus,
    Finding,
    UpstreamReport,
    audit,
    judge,
    record,
)

__all__ = [
    "ATTENTION",
    "JOBS",
    "SCHEMA",
    "AuditStatus",
    "Finding",
    "UpstreamReport",
    "audit",
    "judge",
    "record",
]
