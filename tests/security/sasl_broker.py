"""A Kafka broker of the tests' own that authenticates with SASL/SCRAM and authorizes with
KRaft's StandardAuthorizer (deploy/local/server-sasl.properties), for the per-principal
tests: never the shared broker of `cronstream infra`, only its jars.

Every cronstream principal (shared/acls.py) is a SCRAM user `cronstream-<part>` with a
random password, seeded when the storage is formatted, beside the super user `admin`.
Nothing is allowed to anyone else until ACLs say so.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from cronstream.infra import infra_dir
from cronstream.infra.cluster import free_port_pair
from cronstream.infra.kafka import KAFKA_VERSION, KafkaBroker
from cronstream.shared.acls import PRINCIPALS

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-256"


def user_of(part: str) -> str:
    return ADMIN if part == ADMIN else f"cronstream-{part}"


class SaslBroker:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.broker = KafkaBroker(base, "127.0.0.1", free_port_pair())
        self.broker.libs = infra_dir() / f"kafka-libs-{KAFKA_VERSION}"
        self.passwords = {user_of(p): secrets.token_hex(16) for p in (ADMIN, *PRINCIPALS)}
        self.broker.template = "server-sasl.properties"
        self.broker.values = {"admin_user": ADMIN, "admin_password": self.passwords[ADMIN]}
        self.broker.format_args = [arg for user, password in self.passwords.items() for arg in
                                   ("--add-scram", f"{MECHANISM}=[name={user},password={password}]")]
        self.broker.client_config = self.client_config(ADMIN)

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.address

    def client_config(self, part: str) -> dict[str, str]:
        """librdkafka properties that authenticate as `part`'s principal (or the admin)."""
        user = user_of(part)
        return {"bootstrap.servers": self.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": MECHANISM, "sasl.username": user,
                "sasl.password": self.passwords[user]}

    def env(self, part: str) -> dict[str, str]:
        """The same, as cronstream reads it (CRONSTREAM_KAFKA_<PROPERTY>)."""
        config = self.client_config(part)
        return {"CRONSTREAM_KAFKA_SECURITY_PROTOCOL": config["security.protocol"],
                "CRONSTREAM_KAFKA_SASL_MECHANISM": config["sasl.mechanism"],
                "CRONSTREAM_KAFKA_SASL_USERNAME": config["sasl.username"],
                "CRONSTREAM_KAFKA_SASL_PASSWORD": config["sasl.password"]}

    def start(self) -> None:
        self.broker.start(timeout=120)

    def stop(self) -> None:
        self.broker.stop()
        shutil.rmtree(self.base, ignore_errors=True)
