"""What ``recover status|plan|apply --json`` prints of the ledger's, the log store's and recovery's records (the
text output, :mod:`recovery.render_text`, is made from these too)."""

from __future__ import annotations

import json
from typing import Any

from filesink.committer.ledger import PlannedFile, SchemaVersion
from logstore import DamagedSegment, GivenUp

from .resolve import RecoveryPlan


def file_json(f: PlannedFile) -> dict[str, Any]:
    return {
        "name": f.name,
        "vnodes": [f.vnode_lo, f.vnode_hi],
        "start_epochs": {str(v): s for v, s in sorted(f.starts.items())},
        "end_epoch": f.end_epoch,
        "rows": f.rows,
        "reason": f.reason,
    }


def damaged_json(d: DamagedSegment) -> dict[str, Any]:
    return {"segment": d.name, "epoch": d.epoch, "vnodes": d.vnodes, "rows": d.rows, "problem": str(d.error)}


def given_up_json(g: GivenUp) -> dict[str, Any]:
    return {
        "segment": g.segment,
        "epoch": g.epoch,
        "vnodes": g.vnodes,
        "rows": g.rows,
        "problem": g.problem,
        "term": g.term,
        "given_up_at": g.given_up_at,
    }


def plan_json(plan: RecoveryPlan) -> dict[str, Any]:
    g, o = plan.log_garbage, plan.output_garbage
    result: dict[str, Any] = {}
    if plan.term is not None:
        result["writer_term"] = plan.term
        result["fenced"] = plan.fenced
    return result | {
        "files": [
            {
                **file_json(r.file),
                "visible_objects": [k for k, _ in r.visible],
                "size_mismatch": r.mismatched,
                "in_table": r.held,
                "action": r.action.value,
            }
            for r in plan.files
        ],
        "garbage": {
            "staging_temp_files": len(o.staging_temp_files),
            "staging_dirs": len(o.staging_dirs),
            "multipart_uploads": len(o.uploads),
            "writer_records": len(o.records),
            "released_segments": g.released_segments,
            "unsealed_segments": g.orphan_segments,
            "log_temp_files": g.temp_files,
            "bytes": g.bytes_freed,
        },
        "damaged_segments": [damaged_json(d) for d in plan.damaged],
        "given_up": [given_up_json(g) for g in plan.given_up],
        "nothing_to_do": plan.empty,
    }


def schema_json(v: SchemaVersion) -> dict[str, Any]:
    return {
        "version": v.version,
        "first_epoch": v.first_epoch,
        "columns": [[name, kind] for name, kind in json.loads(v.spark_schema)],
        "changes": list(v.changes),
    }
