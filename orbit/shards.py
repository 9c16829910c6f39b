"""Shard groups: the namespaces one transaction may span.

Every primary key of a runtime table leads with ``namespace_id``, so a fleet that outgrows
one database shards by namespace. A node round (one transaction for everything one stage
received, across namespaces) may only span namespaces that live in the same shard: rounds
are keyed by :func:`shard_group`, and the items of different groups never share a
transaction.

Today every namespace is in one group (one database). A sharded deployment maps a
namespace to its shard here (for example a hash of the namespace id into the keyspace
ranges of the shard map), and every round splits along it without other changes.
"""

from __future__ import annotations

#: The one shard group of an unsharded deployment.
SINGLE_GROUP = 0


def shard_group(namespace_id: bytes) -> int:
    """The shard group of a namespace (rounds never mix groups)."""
    del namespace_id
    return SINGLE_GROUP


__all__ = ["SINGLE_GROUP", "shard_group"]
