#!/usr/bin/env python3
"""Writes numbered records with another client, for ottla to read back.

    py_produce.py --client confluent|kafka-python --bootstrap HOST:PORT --topic T
                  --partitions N --count N [--codec none|gzip|snappy|lz4|zstd]
                  [--transactions K] [--api-version 2.0.0]

Record i goes to partition i % N with key "k<i>", value "v<i>:<codec>:" plus padding,
and headers idx=<i>, codec=<codec> and an empty-valued header "empty". With
--transactions K, the records are written in K transactions and every third one
(index 2, 5, ...) is aborted; the script prints the aborted indexes.

stdout: `aborted i,j,...` (transactions only), then `done <count>`. Errors go to
stderr with a non-zero exit.
"""

import argparse
import sys


def record(i, codec):
    key = f"k{i}".encode()
    value = (f"v{i}:{codec}:" + "x" * (i % 97)).encode()
    headers = [("idx", str(i).encode()), ("codec", codec.encode()), ("empty", b"")]
    return key, value, headers


def confluent(args):
    from confluent_kafka import Producer

    config = {
        "bootstrap.servers": args.bootstrap,
        "compression.type": args.codec,
        "linger.ms": 5,
    }
    if args.transactions:
        config["transactional.id"] = f"ottla-interop-{args.topic}"
    errors = []

    def delivered(err, _msg):
        if err is not None:
            errors.append(err)

    producer = Producer(config)
    aborted = []
    if args.transactions:
        producer.init_transactions(30)
        per = max(1, args.count // args.transactions)
        for t in range(args.transactions):
            producer.begin_transaction()
            last = args.count if t == args.transactions - 1 else (t + 1) * per
            for i in range(t * per, last):
                key, value, headers = record(i, args.codec)
                producer.produce(args.topic, value=value, key=key, headers=headers,
                                 partition=i % args.partitions, on_delivery=delivered)
            if t % 3 == 2:
                # Flushed first: an abort purges what is still queued, and the test
                # wants aborted records in the log, behind their ABORT markers.
                if producer.flush(30):
                    raise RuntimeError("records of an aborting transaction not sent")
                producer.abort_transaction(30)
                aborted.extend(range(t * per, last))
            else:
                producer.commit_transaction(30)
    else:
        for i in range(args.count):
            key, value, headers = record(i, args.codec)
            while True:
                try:
                    producer.produce(args.topic, value=value, key=key, headers=headers,
                                     partition=i % args.partitions, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(30)
        if left:
            raise RuntimeError(f"{left} records not delivered")
    if errors and not args.transactions:
        raise RuntimeError(f"delivery errors: {errors[:5]}")
    return aborted


def kafka_python(args):
    from kafka import KafkaProducer

    options = {"bootstrap_servers": args.bootstrap, "linger_ms": 5}
    if args.codec != "none":
        options["compression_type"] = args.codec
    if args.api_version:
        options["api_version"] = tuple(int(p) for p in args.api_version.split("."))
    if args.transactions:
        raise RuntimeError("kafka-python transactions are not used by these tests")
    producer = KafkaProducer(**options)
    futures = []
    for i in range(args.count):
        key, value, headers = record(i, args.codec)
        futures.append(producer.send(args.topic, value=value, key=key, headers=headers,
                                     partition=i % args.partitions))
    producer.flush(30)
    for f in futures:
        f.get(timeout=30)
    producer.close(10)
    return []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True, choices=["confluent", "kafka-python"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--codec", default="none",
                        choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--transactions", type=int, default=0)
    parser.add_argument("--api-version")
    args = parser.parse_args()
    try:
        run = confluent if args.client == "confluent" else kafka_python
        aborted = run(args)
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails
        print(f"error {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    if args.transactions:
        print("aborted " + ",".join(str(i) for i in aborted), flush=True)
    print(f"done {args.count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
