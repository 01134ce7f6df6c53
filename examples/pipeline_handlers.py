"""The handlers of examples/pipeline.yaml: each DAG step reads what its upstream returned
from `ctx.upstream` instead of a side channel (a bucket, a table). Start a worker with
`--import pipeline_handlers` (with this folder on PYTHONPATH; `cronstream dev` does both).
"""

from cronstream import Context, handler


@handler("examples.extract")
def extract(ctx: Context) -> dict[str, object]:
    region = str(ctx.params.get("region", "all"))
    rows = [{"region": region, "n": i} for i in range(int(ctx.params.get("rows", 3)))]
    return {"region": region, "rows": rows}


@handler("examples.transform")
def transform(ctx: Context) -> dict[str, object]:
    extracted = ctx.upstream["example.pipeline.extract"].result
    factor = int(ctx.params.get("factor", 1))
    return {"rows": [{**row, "n": row["n"] * factor} for row in extracted["rows"]]}


@handler("examples.load")
def load(ctx: Context) -> dict[str, object]:
    transformed = ctx.upstream["example.pipeline.transform"]
    region = ctx.upstream.root_params.get("region", "all")  # what the run was started with
    ctx.report_progress(50, f"loading {len(transformed.result['rows'])} rows for {region}")
    return {"loaded": len(transformed.result["rows"]), "region": region,
            "from_execution": str(transformed.execution_id)}


@handler("examples.audit")
def audit(ctx: Context) -> dict[str, object]:
    """The loads that completed since the last audit: one execution event each (ctx.events)."""
    loads = [event.value for event in ctx.events]
    return {"audited": len(loads), "regions": sorted({str(e["result"]["region"]) for e in loads}),
            "offsets": [event.offset for event in ctx.events]}
