"""An example handler module: start a worker with `--import report_handlers` (with this
folder on PYTHONPATH; `cronstream dev` does both)."""

from cronstream import Context, handler


@handler("examples.report")
def report(ctx: Context) -> dict[str, object]:
    rows = int(ctx.params.get("rows", 0))
    ctx.report_progress(50, "counting rows")
    return {"rows": rows, "attempt": ctx.attempt_number, "idempotency_key": ctx.idempotency_key}
