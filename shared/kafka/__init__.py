"""Kafka plumbing shared by every service, one module per concept:

- `config`: how each kind of client is configured;
- `consumer`: the one way a service reads (`ConsumerThread`, its verbs, `OnLane`);
- `reading`: positions, offsets since a time, reading compacted state to its end;
- `errors`: what Kafka's errors mean (refused, fatal, settling);
- `admin`: creating, listing and deleting topics, their ends;
- `lag`: a group's lag on the work topics (queue depth).

Producers live in `shared/producers.py` (with `OutRecord`, what they write), the inbound
path (decode, validate, dead-letter) in `shared/inbound.py`, how a service gets its
clients (injected: tests run it on an in-memory bus) in `shared/clients.py`.
"""
