#!/usr/bin/env python3
"""A long-running consumer-group member driven by ottla's Rust tests (`src/pyclient.rs`).

It joins a group with confluent-kafka (librdkafka), kafka-python or aiokafka and reports on
stdout, one flushed line per event:

    ready                   subscribed (the join is under way)
    assigned t:0,t:3        the full current assignment, after every change
                            (also after a revocation; empty: a bare `assigned`)
    revoked t:0             partitions given up in a rebalance
    lost t:0                partitions lost without a clean revocation
    error <message>         a client error (many are transient and retried)
    record t:3:17           with --records: a record reached the application
    closed                  the consumer left the group and closed

It consumes until stdin closes or reads a line `quit`, then closes the consumer, which
leaves the group (unless it is a static member, --instance-id). Records are ignored
unless --records is given; then each is reported, and the member commits the position
of every partition it gives back, synchronously in the revocation callback (and, for
aiokafka, of what it holds when it closes), so the next owner starts after the last
record reported here (confluent-kafka and aiokafka).

--strategy default leaves partition.assignment.strategy to the client's own default
(librdkafka's `range,roundrobin`, aiokafka's `roundrobin`): a team's service as it runs
before a move to ottla.

--group-protocol consumer (confluent-kafka only) joins with KIP-848's consumer group
protocol: the broker assigns, so there is no --strategy, and librdkafka refuses the
classic protocol's session.timeout.ms and heartbeat.interval.ms (the broker sets both).

Exit status: 0 after a clean close, 2 on a bad argument or a failed start or close,
3 when the client does not support the strategy or the group protocol (`error unsupported ...`).

Needs the packages from `bash scripts/install-peers.sh` on PYTHONPATH
(`<workspace>/.peers/python`).
"""

import argparse
import sys
import threading
import time

_out_lock = threading.Lock()

# kafka-python's poll timeouts, outside and during a join; see kafka_python_poll.
KAFKA_PYTHON_POLL_MS = 200
KAFKA_PYTHON_JOIN_POLL_MS = 10000


def emit(line):
    with _out_lock:
        sys.stdout.write(line.replace("\n", " ") + "\n")
        sys.stdout.flush()


def fmt(parts):
    return ",".join("%s:%d" % tp for tp in sorted(parts))


class Assignment:
    """The member's current assignment, as a set of (topic, partition)."""

    def __init__(self, incremental):
        # Cooperative protocols hand out increments; eager ones the whole assignment.
        self.incremental = incremental
        self.current = set()
        self.lock = threading.Lock()

    def _report(self):
        emit(("assigned " + fmt(self.current)).rstrip())

    def assigned(self, parts):
        with self.lock:
            if self.incremental:
                self.current |= parts
            else:
                self.current = set(parts)
            self._report()

    def revoked(self, parts, word="revoked"):
        if not parts:  # eager clients announce an empty revocation before a first join
            return
        with self.lock:
            emit((word + " " + fmt(parts)).rstrip())
            if self.incremental:
                self.current -= parts
            else:
                self.current = set()
            self._report()


def watch_stdin(stop):
    """Sets `stop` at end of input or on a line `quit`."""
    try:
        for line in sys.stdin:
            if line.strip() == "quit":
                break
    except Exception:  # a closed or broken stdin means the same: stop
        pass
    stop.set()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client", required=True, choices=["confluent", "kafka-python", "aiokafka"])
    p.add_argument("--bootstrap", required=True, help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True, action="append", dest="topics")
    p.add_argument(
        "--strategy",
        choices=["range", "roundrobin", "cooperative-sticky", "default"],
        help="the classic protocol's assignor (required with it, refused with consumer);"
        " default: the client's own default list",
    )
    p.add_argument(
        "--group-protocol",
        choices=["classic", "consumer"],
        default="classic",
        help="group.protocol; consumer (KIP-848) is for confluent-kafka only",
    )
    p.add_argument(
        "--records",
        action="store_true",
        help="confluent-kafka and aiokafka: report every record and commit what is given back",
    )
    p.add_argument("--session-timeout-ms", type=int)
    p.add_argument("--heartbeat-ms", type=int)
    p.add_argument("--instance-id", help="group.instance.id: a static member")
    p.add_argument("--client-id")
    p.add_argument(
        "--api-version",
        help="kafka-python only: skip version probing, e.g. 2.0.0 (needed on the librdkafka mock)",
    )
    p.add_argument(
        "--assign-delay-ms",
        type=int,
        help="kafka-python only: as leader, wait this long before computing the assignment"
        " (works around the librdkafka mock's SyncGroup race, see PEERS.md)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="confluent-kafka only: one more librdkafka property (security.protocol, ssl.*, sasl.*)",
    )
    p.add_argument(
        "--log-level",
        help="client logs on stderr: a Python logging level for kafka-python (INFO, DEBUG);"
        " for confluent-kafka, DEBUG turns on librdkafka's cgrp debug log",
    )
    return p.parse_args(argv)


def tp_set(partitions):
    return {(tp.topic, tp.partition) for tp in partitions}


def run_confluent(args, stop):
    from confluent_kafka import Consumer, KafkaError, KafkaException

    consumer_protocol = args.group_protocol == "consumer"
    conf = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "error_cb": lambda err: emit("error %s" % err),
    }
    if consumer_protocol:
        # KIP-848: the broker assigns and sets the session and the heartbeat interval.
        conf["group.protocol"] = "consumer"
    elif args.strategy != "default":
        conf["partition.assignment.strategy"] = args.strategy
    if args.session_timeout_ms is not None:
        conf["session.timeout.ms"] = args.session_timeout_ms
    if args.heartbeat_ms is not None:
        conf["heartbeat.interval.ms"] = args.heartbeat_ms
    if args.instance_id:
        conf["group.instance.id"] = args.instance_id
    if args.client_id:
        conf["client.id"] = args.client_id
    if args.log_level and args.log_level.upper() == "DEBUG":
        conf["debug"] = "cgrp"
    for pair in args.set:
        key, sep, value = pair.partition("=")
        if not sep:
            emit("error --set %r: expected KEY=VALUE" % pair)
            return 2
        conf[key] = value

    # KIP-848 hands out increments, as the cooperative protocol does.
    state = Assignment(incremental=consumer_protocol or args.strategy == "cooperative-sticky")
    try:
        consumer = Consumer(conf)
    except KafkaException as e:
        emit("error creating the consumer: %s" % e)
        return 2

    # The callbacks run inside poll()/close(), on this thread. librdkafka applies the
    # assignment itself after a callback that does not call (incremental_)assign.
    def on_assign(c, parts):
        state.assigned(tp_set(parts))

    def on_revoke(c, parts):
        if args.records:
            commit_positions(c, parts)
        state.revoked(tp_set(parts))

    def on_lost(c, parts):
        state.revoked(tp_set(parts), word="lost")

    consumer.subscribe(args.topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("ready")
    while not stop.is_set():
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error() is not None:
            if msg.error().code() != KafkaError._PARTITION_EOF:
                emit("error %s" % msg.error())
        elif args.records:
            emit("record %s:%d:%d" % (msg.topic(), msg.partition(), msg.offset()))
    try:
        consumer.close()
    except KafkaException as e:
        emit("error closing: %s" % e)
        return 2
    emit("closed")
    return 0


def commit_positions(consumer, parts):
    """Commits, synchronously, the position (the next record to deliver) of each of
    `parts` that has one: what was reported is done, and the next owner starts after it."""
    from confluent_kafka import KafkaException

    if not parts:
        return
    try:
        positions = [tp for tp in consumer.position(parts) if tp.offset >= 0]
        if positions:
            consumer.commit(offsets=positions, asynchronous=False)
    except KafkaException as e:
        emit("error committing at revocation: %s" % e)


def parse_version(text):
    try:
        version = tuple(int(x) for x in text.split("."))
    except ValueError:
        version = ()
    if not 1 <= len(version) <= 3:
        raise SystemExit("--api-version %r: expected X.Y.Z" % text)
    return version


def delayed(base, delay_s):
    """`base` (a kafka-python assignor class), with a pause before each assignment.

    The librdkafka mock completes a generation's sync as soon as the leader's SyncGroup
    has brought every member's assignment, answering only the SyncGroups it holds by
    then; a follower whose SyncGroup comes later gets INVALID_REQUEST (42), rejoins, and
    the mock waits session timeout - 1 s before the next election. kafka-python's leader
    is fast enough to lose that race round after round; a short pause lets the
    followers' SyncGroups arrive first. Harmless on a real broker.
    """

    class Delayed(base):
        def assign(self, cluster, members):
            time.sleep(delay_s)
            return super().assign(cluster, members)

    Delayed.__name__ = Delayed.__qualname__ = base.__name__
    return Delayed


def kafka_python_poll(consumer):
    """One poll; while the member (re)joins, one that lasts until the join is over.

    kafka-python 3.0.12 drops a JoinGroup+SyncGroup result that completes just as
    poll()'s timer runs out: the next poll() finds the join task done, discards it and
    starts a new join, which costs a whole extra rebalance (5 s a round on the mock,
    and with the mock's whole-second rounds an unlucky phase repeats). So no poll may
    time out in the middle of a join. `consumer.poll` waits out its whole timeout when
    no records come, so a join is driven by the coordinator's own poll, which returns
    as soon as the member has joined. `quit` is noticed after the join.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    try:
        joining = coordinator is not None and coordinator.need_rejoin()
    except Exception:  # private API: without it, plain short polls
        joining = False
    if joining:
        coordinator.poll(timeout_ms=KAFKA_PYTHON_JOIN_POLL_MS)
    else:
        consumer.poll(timeout_ms=KAFKA_PYTHON_POLL_MS)


def run_kafka_python(args, stop):
    if args.set:
        emit("error --set is for confluent-kafka only")
        return 2
    import kafka
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    if args.strategy == "range":
        assignor = RangePartitionAssignor
    elif args.strategy == "roundrobin":
        assignor = RoundRobinPartitionAssignor
    else:
        try:  # KIP-429, added in kafka-python 3.0
            from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        except ImportError:
            emit("error unsupported: kafka-python %s has no cooperative-sticky" % kafka.__version__)
            return 3
        assignor = CooperativeStickyAssignor

    if args.assign_delay_ms:
        assignor = delayed(assignor, args.assign_delay_ms / 1000.0)

    state = Assignment(incremental=args.strategy == "cooperative-sticky")

    class Listener(ConsumerRebalanceListener):
        # Eager: revoked(everything) then assigned(everything new). Cooperative:
        # revoked(what moves away) and assigned(what is new), both increments.
        def on_partitions_revoked(self, revoked):
            state.revoked(tp_set(revoked))

        def on_partitions_assigned(self, assigned):
            state.assigned(tp_set(assigned))

        def on_partitions_lost(self, lost):
            state.revoked(tp_set(lost), word="lost")

    conf = {
        "bootstrap_servers": args.bootstrap.split(","),
        "group_id": args.group,
        "partition_assignment_strategy": (assignor,),
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
    }
    if args.session_timeout_ms is not None:
        conf["session_timeout_ms"] = args.session_timeout_ms
    if args.heartbeat_ms is not None:
        conf["heartbeat_interval_ms"] = args.heartbeat_ms
    if args.instance_id:
        conf["group_instance_id"] = args.instance_id
    if args.client_id:
        conf["client_id"] = args.client_id
    if args.api_version:
        conf["api_version"] = parse_version(args.api_version)
    if args.log_level:
        import logging

        logging.basicConfig(
            stream=sys.stderr,
            level=args.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )

    try:
        consumer = KafkaConsumer(**conf)
    except Exception as e:
        emit("error creating the consumer: %s: %s" % (type(e).__name__, e))
        return 2
    consumer.subscribe(args.topics, listener=Listener())
    emit("ready")
    last_error = None
    while not stop.is_set():
        try:
            kafka_python_poll(consumer)
            last_error = None
        except Exception as e:
            text = "%s: %s" % (type(e).__name__, e)
            if text != last_error:  # a persistent failure once, not ten times a second
                emit("error %s" % text)
            last_error = text
            time.sleep(0.1)
    try:
        consumer.close(autocommit=False)
    except Exception as e:
        emit("error closing: %s: %s" % (type(e).__name__, e))
        return 2
    emit("closed")
    return 0


def run_aiokafka(args, stop):
    """aiokafka 0.14: an asyncio consumer; eager assignors only (no cooperative-sticky)."""
    if args.set or args.api_version or args.assign_delay_ms:
        emit("error --set, --api-version and --assign-delay-ms are not for aiokafka")
        return 2
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    conf = {
        "bootstrap_servers": args.bootstrap.split(","),
        "group_id": args.group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
    }
    if args.strategy == "range":
        conf["partition_assignment_strategy"] = (RangePartitionAssignor,)
    elif args.strategy == "roundrobin":
        conf["partition_assignment_strategy"] = (RoundRobinPartitionAssignor,)
    elif args.strategy != "default":
        emit("error unsupported: aiokafka has no %s" % args.strategy)
        return 3
    if args.session_timeout_ms is not None:
        conf["session_timeout_ms"] = args.session_timeout_ms
    if args.heartbeat_ms is not None:
        conf["heartbeat_interval_ms"] = args.heartbeat_ms
    if args.client_id:
        conf["client_id"] = args.client_id
    if args.instance_id:
        emit("error unsupported: aiokafka has no group.instance.id")
        return 3
    if args.log_level:
        import logging

        logging.basicConfig(
            stream=sys.stderr,
            level=args.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    state = Assignment(incremental=False)

    async def commit_held(consumer, parts):
        if not args.records or not parts:
            return
        try:
            offsets = {}
            for tp in parts:
                offsets[tp] = await consumer.position(tp)
            if offsets:
                await consumer.commit(offsets)
        except Exception as e:
            emit("error committing at revocation: %s: %s" % (type(e).__name__, e))

    async def main():
        consumer = AIOKafkaConsumer(**conf)

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                await commit_held(consumer, revoked)
                state.revoked(tp_set(revoked))

            async def on_partitions_assigned(self, assigned):
                state.assigned(tp_set(assigned))

        try:
            await consumer.start()
        except Exception as e:
            emit("error starting the consumer: %s: %s" % (type(e).__name__, e))
            return 2
        consumer.subscribe(args.topics, listener=Listener())
        emit("ready")
        last_error = None
        while not stop.is_set():
            try:
                batch = await consumer.getmany(timeout_ms=100)
                last_error = None
            except Exception as e:
                text = "%s: %s" % (type(e).__name__, e)
                if text != last_error:
                    emit("error %s" % text)
                last_error = text
                await asyncio.sleep(0.1)
                continue
            if args.records:
                for tp, messages in batch.items():
                    for m in messages:
                        emit("record %s:%d:%d" % (m.topic, m.partition, m.offset))
        # Leaving does not revoke in aiokafka: commit what is held first.
        await commit_held(consumer, consumer.assignment())
        try:
            await consumer.stop()
        except Exception as e:
            emit("error closing: %s: %s" % (type(e).__name__, e))
            return 2
        emit("closed")
        return 0

    return asyncio.run(main())


def main(argv):
    args = parse_args(argv)
    if args.group_protocol == "consumer":
        if args.client != "confluent":
            emit("error unsupported: %s has no group.protocol=consumer" % args.client)
            return 3
        refused = [
            ("--strategy", args.strategy),
            ("--session-timeout-ms", args.session_timeout_ms),
            ("--heartbeat-ms", args.heartbeat_ms),
        ]
        for flag, value in refused:
            if value is not None:
                emit("error %s is the classic protocol's; the broker sets it with consumer" % flag)
                return 2
    elif args.strategy is None:
        emit("error --strategy is required with the classic group protocol")
        return 2
    if args.records and args.client == "kafka-python":
        emit("error --records is for confluent-kafka and aiokafka only")
        return 2
    if args.strategy == "default" and args.client == "kafka-python":
        emit("error --strategy default is for confluent-kafka and aiokafka")
        return 2
    if args.client != "kafka-python":
        for flag, value in [("--api-version", args.api_version), ("--assign-delay-ms", args.assign_delay_ms)]:
            if value:
                emit("error %s is for kafka-python only" % flag)
                return 2
    stop = threading.Event()
    threading.Thread(target=watch_stdin, args=(stop,), daemon=True).start()
    try:
        if args.client == "confluent":
            return run_confluent(args, stop)
        if args.client == "aiokafka":
            return run_aiokafka(args, stop)
        return run_kafka_python(args, stop)
    except ImportError as e:
        emit(
            "error %s: install the client peers with `bash scripts/install-peers.sh` "
            "and put <workspace>/.peers/python on PYTHONPATH" % e
        )
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
