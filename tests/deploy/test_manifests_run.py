"""The manifests run: the prod overlay's Job, Deployments and StatefulSets, started as local
processes exactly as their pods would start them, carry a job end to end.

`init` must complete on an empty database (it applies the migrations); every service and
the UI must answer its startup/liveness probe, then its readiness probe, on its own path
and port (analytics is ready once it has replayed its lookback); serve /metrics on the
port its Service targets; run a ONE_TIME job to COMPLETED (projected in PostgreSQL, on the
worker named after its pod); the UI, through its Service's port, must ask for a login,
show the job with the token of its Secret and run it again on a trigger; and every
process must stop cleanly on SIGTERM within its terminationGracePeriodSeconds. What the
test substitutes (values only) is listed in tests/deploy/running.py.
"""

from __future__ import annotations

from pathlib import Path

from tests.deploy.running import local_launcher, run_prod_end_to_end


def test_prod_manifests_run_a_job_end_to_end(servers: tuple[str, str], empty_database: str,
                                             tmp_path: Path) -> None:
    kafka, _ = servers
    run_prod_end_to_end(kafka, empty_database, tmp_path, local_launcher)
