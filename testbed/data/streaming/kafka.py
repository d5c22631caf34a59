"""Apache Kafka (KRaft, one node: broker and controller in one process) from its official image.

`broker: {kind: kafka}` runs this on the broker node of the docker runtime; compose/kafka.yml
runs the same settings by hand (e.g. on another machine, for `kind: external`). A test keeps
the two in step.
"""

from __future__ import annotations

from testbed.data.streaming.broker import KAFKA_PORT

CONTROLLER_PORT = 9093
CLUSTER_ID = "ZWRnZWJlZC1rYWZrYS0wMQ"  # base64url of 16 bytes ("edgebed-kafka-01"), as KRaft wants


def kafka_environment(advertised_host: str, port: int = KAFKA_PORT, listen_host: str = "0.0.0.0") -> dict[str, str]:
    """Environment of the apache/kafka image for a single-node KRaft broker at advertised_host:port,
    listening on listen_host (a broker node: all its addresses; compose's, beside an external-mode
    run: this host's loopback, which the run's relay reaches).

    One partition and replication factor 1 everywhere (one broker; ScaDLES used one partition
    per topic); no group rebalance delay (edgebed's consumers use assign(), see FACTS.md).
    """
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://{listen_host}:{port},CONTROLLER://127.0.0.1:{CONTROLLER_PORT}",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{advertised_host}:{port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@127.0.0.1:{CONTROLLER_PORT}",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_NUM_PARTITIONS": "1",
        "CLUSTER_ID": CLUSTER_ID,
    }
