"""`cronstream kafka-acls`: the minimal Kafka ACLs per principal, printed or applied."""

from __future__ import annotations

import shlex

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import Column, dump_json, dump_yaml, emit, show
from cronstream.shared.acls import DEFAULT_PRINCIPAL_PREFIX, PRINCIPALS, Acl, acls, principals, trigger_topics

COLUMNS = [
    Column("principal", lambda r: r["principal"]),
    Column("resource", lambda r: r["resource"]),
    Column("pattern", lambda r: r["pattern"]),
    Column("name", lambda r: r["name"]),
    Column("operation", lambda r: r["operation"]),
]
# librdkafka calls Kafka's CLUSTER resource BROKER.
_RESOURCE_TYPES = {"TOPIC": "TOPIC", "GROUP": "GROUP", "TRANSACTIONAL_ID": "TRANSACTIONAL_ID",
                   "CLUSTER": "BROKER"}
_CLI_RESOURCE = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id",
                 "CLUSTER": "--cluster"}


def kafka_acls_command(acl: Acl) -> str:
    """The same binding as an `kafka-acls.sh` invocation, for clusters administered by hand."""
    resource = _CLI_RESOURCE[acl.resource]
    target = [resource] if acl.resource == "CLUSTER" else [resource, acl.name]
    argv = ["kafka-acls.sh", "--bootstrap-server", "$BOOTSTRAP", "--command-config", "$ADMIN_CONFIG",
            "--add", "--allow-principal", acl.principal, "--operation", acl.operation.capitalize(),
            *target, "--resource-pattern-type", acl.pattern.lower()]
    return " ".join(a if a.startswith("$") else shlex.quote(a) for a in argv)


def apply(state: CliState, bindings: list[Acl]) -> int:
    """Create the bindings through the Admin API (existing ones are left as they are)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from cronstream.shared.kafka.config import client_config

    admin = AdminClient(client_config(state.settings(), "cronstream-acls"))
    futures = admin.create_acls([
        AclBinding(ResourceType[_RESOURCE_TYPES[a.resource]], a.name, ResourcePatternType[a.pattern],
                   a.principal, a.host, AclOperation[a.operation], AclPermissionType.ALLOW)
        for a in bindings], request_timeout=state.timeout)
    failed = []
    for binding, future in futures.items():
        try:
            future.result(state.timeout * 3)
        except KafkaException as exc:
            failed.append(f"{binding}: {exc.args[0].str() if exc.args else exc}")
    if failed:
        raise click.ClickException("ACLs refused by the cluster:\n  " + "\n  ".join(failed))
    return len(futures)


@click.command("kafka-acls")
@click.option("--principal", "overrides", multiple=True, metavar="PART=PRINCIPAL",
              help="The principal of one part (repeatable), e.g. worker=User:svc-workers. "
                   f"Parts: {', '.join(PRINCIPALS)}.")
@click.option("--principal-prefix", default=DEFAULT_PRINCIPAL_PREFIX, show_default=True,
              help="Principal of each part not named by --principal: this plus the part's name.")
@click.option("--only", "only", multiple=True, type=click.Choice(list(PRINCIPALS)),
              help="Only these parts (repeatable).")
@click.option("-o", "--output", "fmt", default="table", show_default=True,
              type=click.Choice(["table", "json", "yaml", "commands"]),
              help="Output format (`commands`: kafka-acls.sh invocations).")
@click.option("--trigger-topic", "trigger_topics_given", multiple=True, metavar="TOPIC",
              help="A source topic of an event trigger (its full name; repeatable): the "
                   "scheduler may read it.")
@click.option("--from-definitions", is_flag=True,
              help="Add READ for the source topic of every EVENT job published now (reads "
                   "job-definitions to its end).")
@click.option("--apply", "apply_them", is_flag=True,
              help="Create them on the cluster through the Admin API, with this command's own "
                   "Kafka credentials (an administrator's: CRONSTREAM_KAFKA_SASL_*).")
@pass_state
def kafka_acls(state: CliState, overrides: tuple[str, ...], principal_prefix: str, only: tuple[str, ...],
               trigger_topics_given: tuple[str, ...], from_definitions: bool, fmt: str,
               apply_them: bool) -> None:
    """The minimal Kafka ACLs of each principal: the services, the dashboard, the CLI and SDK
    writers, KEDA and `cronstream init`, for this topic prefix.

    Each part authenticates as its own principal (docs/deploy.md, "Who may do what"):
    a worker cannot publish job definitions, the dashboard cannot write execution events.
    The scheduler reads the source topics of event triggers: name them with --trigger-topic,
    or take them from the published EVENT jobs with --from-definitions.
    """
    given: dict[str, str] = {}
    for item in overrides:
        part, sep, principal = item.partition("=")
        if not sep or not principal.strip():
            raise click.BadParameter(f"expected PART=PRINCIPAL, got {item!r}", param_hint="--principal")
        given[part.strip()] = principal.strip()
    try:
        names = principals(given, principal_prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--principal") from None
    if only:
        names = {part: names[part] for part in only}
    sources = set(trigger_topics_given)
    if from_definitions:
        with state.client() as client:
            sources.update(trigger_topics(client.definitions().values()))
    bindings = acls(state.settings().topics, names, sorted(sources))
    if apply_them:
        count = apply(state, bindings)
        emit(f"{count} ACL bindings applied for {', '.join(names)}", err=True)
        return
    rows = [a.as_row() for a in bindings]
    if fmt == "commands":
        emit("\n".join(kafka_acls_command(a) for a in bindings))
    elif fmt == "json":
        emit(dump_json(rows))
    elif fmt == "yaml":
        emit(dump_yaml(rows).rstrip("\n"))
    else:
        show(rows, COLUMNS, fmt)


COMMANDS = [kafka_acls]
