//! Record-batch decode micro-benchmark: the same captured Fetch-response record bytes
//! through ottla's in-place batch iterator (CRC32C checked, and not), `kafka-protocol`'s
//! `RecordBatchDecoder` (owned records; it always checks the CRC) and a minimal walker
//! that only follows lengths. Prints ns per record and, with `--callgrind`, instructions
//! per record counted by `valgrind --tool=callgrind`, then issue 21's decode targets
//! (`bench::targets`, as `bench` prints its own).
//!
//! ```text
//! cargo run --release -p protocol-tests --no-default-features --bin bench-decode -- [--callgrind]
//!     [--peer mock|tansu|encode] [--records 100000] [--batch-bytes 16384] [--partitions 4]
//!     [--input FILE] [--runs 7] [--ms 200] [--cg-iters 3]
//! bench-decode --capture FILE [--peer mock|tansu|encode] [--records N] [--batch-bytes B]
//! bench-decode --replay FILE --decoder none|walker|ottla|ottla-nocrc|kafka-protocol --iters N
//! ```
//!
//! Input, unless `--input FILE` names an earlier capture: librdkafka (through rdkafka)
//! produces `--records` records round-robin to `--partitions` partitions (default 4: the
//! librdkafka mock keeps only the last 5 MiB of a partition) (key `user-NNNNNNNNNN`,
//! a 100-byte value, one `trace-id` header with a 16-byte value; no compression;
//! `batch.size` `--batch-bytes`, the Java producer's default 16384, and `linger.ms` 5).
//! ottla's own Fetch request, over its driver's broker connection, fetches them back
//! with `max.partition.fetch.bytes` 1 MiB; each response's `records` bytes, cut to whole
//! batches, are kept as they came (the mock answers with one batch per response, tansu
//! with the whole partition; per-record figures barely differ). They are saved under `target/bench-decode/` and
//! every decoder, in this process and under callgrind, reads that file. `--peer encode`
//! writes the same records with ottla's `encode_batch` instead of fetching them.
//!
//! Every decoder hands each record's key, value and headers to `black_box` and sums
//! their lengths; records and key+value bytes must agree across decoders (and header
//! bytes across the three real decoders; the walker touches the headers as one slice).
//! Instructions per record are `(Ir(decoder) - Ir(none)) / (records * iters)`, where
//! `none` loads the same file and decodes nothing.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::records::RecordBatchDecoder;
use ottla::ClientConfig;
use ottla::driver::{Cluster, TopicScope};
use ottla_bench::arg;
use ottla_bench::targets::{self, Outcome};
use ottla_proto::fetch::batch::{BatchOptions, Batches, Compression};
use ottla_proto::fetch::request::{FetchParams, FetchTarget, fetch_request, fetched_partitions};
use ottla_proto::produce::encode::{OutRecord, ProducerFields, encode_batch};
use protocol_tests::peer::Peer;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};

const MAGIC: &[u8] = b"ottla-bench-decode 1\n";
const TOPIC: &str = "bench-decode";
const VALUE_LEN: usize = 100;
/// `max.partition.fetch.bytes` of the capturing fetches (the Java default).
const PARTITION_FETCH_BYTES: i32 = 1 << 20;
/// Batch header length up to the first record (v2).
const BATCH_HEADER: usize = 61;

fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-decode") {
        return refused;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-decode: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    if let Some(file) = sarg("--replay") {
        let name = sarg("--decoder").context("--replay needs --decoder")?;
        let decoder = Decoder::from_name(&name).with_context(|| format!("decoder {name}?"))?;
        return replay(Path::new(&file), decoder, arg("--iters", 1));
    }
    let peer = sarg("--peer").unwrap_or_else(|| "mock".into());
    let records = arg("--records", 100_000);
    let batch_bytes = arg("--batch-bytes", 16_384);
    let partitions = arg("--partitions", 4).clamp(1, 1000) as i32;
    if let Some(file) = sarg("--capture") {
        let input = capture(&peer, records, batch_bytes, partitions)?;
        input.save(Path::new(&file))?;
        println!("wrote {file}: {}", input.summary()?);
        return Ok(());
    }
    let path = match sarg("--input") {
        Some(file) => PathBuf::from(file),
        None => {
            let path = work_dir()?.join(format!("records-{peer}.bin"));
            if peer == "encode" {
                println!("generating {records} records with ottla's encode_batch ...");
            } else {
                println!("capturing {records} records from {peer} ...");
            }
            capture(&peer, records, batch_bytes, partitions)?.save(&path)?;
            path
        }
    };
    let input = Input::load(&path)?;
    println!("input: {}", path.display());
    println!("  source: {}", input.source);
    println!("  {}", input.summary()?);
    let reference = input.check()?;
    let per_pass = reference.records;

    let runs = arg("--runs", 7).max(1);
    let timed = time_all(&input.chunks, runs, arg("--ms", 200), reference)?;
    println!();
    println!(
        "ns per record: median (min) of {runs} timed runs, each of whole passes over the input"
    );
    println!(
        "{:<26} {:>14} {:>10} {:>12}",
        "decoder", "ns/record", "records", "x walker"
    );
    let walker_ns = timed[0].1;
    for &(decoder, median, min) in &timed {
        println!(
            "{:<26} {:>6.2} ({:>5.2}) {:>10} {:>11.2}x",
            decoder.label(),
            median,
            min,
            per_pass,
            median / walker_ns
        );
    }

    if flag("--callgrind") {
        let iters = arg("--cg-iters", 3).max(1);
        callgrind(&path, iters, reference)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Decoders

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoder {
    /// Loads the input and decodes nothing: the callgrind baseline.
    None,
    Walker,
    Ottla,
    OttlaNoCrc,
    KafkaProtocol,
}

impl Decoder {
    const MEASURED: [Decoder; 4] = [
        Decoder::Walker,
        Decoder::Ottla,
        Decoder::OttlaNoCrc,
        Decoder::KafkaProtocol,
    ];

    fn name(self) -> &'static str {
        match self {
            Decoder::None => "none",
            Decoder::Walker => "walker",
            Decoder::Ottla => "ottla",
            Decoder::OttlaNoCrc => "ottla-nocrc",
            Decoder::KafkaProtocol => "kafka-protocol",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Decoder::None => "baseline (load only)",
            Decoder::Walker => "walker (lengths only)",
            Decoder::Ottla => "ottla (CRC on)",
            Decoder::OttlaNoCrc => "ottla (CRC off)",
            Decoder::KafkaProtocol => "kafka-protocol 0.18 (CRC)",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Decoder::None]
            .into_iter()
            .chain(Decoder::MEASURED)
            .find(|d| d.name() == name)
    }

    /// One pass over every chunk, adding to `tally`.
    fn run(self, chunks: &[Bytes], tally: &mut Tally) {
        match self {
            Decoder::None => {}
            Decoder::Walker => walk(chunks, tally),
            Decoder::Ottla => decode_ottla(chunks, true, tally),
            Decoder::OttlaNoCrc => decode_ottla(chunks, false, tally),
            Decoder::KafkaProtocol => decode_kafka_protocol(chunks, tally),
        }
    }
}

/// What a pass saw; black-boxed per record so that no decoder's work can be dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    records: u64,
    /// Key plus value bytes.
    kv: u64,
    /// Header key plus value bytes (the walker: the bytes of the headers section).
    headers: u64,
}

#[inline(always)]
fn touch(t: &mut Tally, key: Option<&[u8]>, value: Option<&[u8]>) {
    t.records += 1;
    t.kv +=
        (black_box(key).map_or(0, <[u8]>::len) + black_box(value).map_or(0, <[u8]>::len)) as u64;
}

#[inline(always)]
fn touch_header(t: &mut Tally, key: &[u8], value: Option<&[u8]>) {
    t.headers += (black_box(key).len() + black_box(value).map_or(0, <[u8]>::len)) as u64;
}

fn decode_ottla(chunks: &[Bytes], check_crcs: bool, t: &mut Tally) {
    let options = BatchOptions {
        check_crcs,
        ..BatchOptions::default()
    };
    for chunk in chunks {
        for batch in Batches::new(chunk.clone(), options) {
            let batch = batch.expect("ottla: batch");
            for record in batch.records() {
                let record = record.expect("ottla: record");
                touch(t, record.key(), record.value());
                for h in record.headers() {
                    touch_header(t, h.key(), h.value());
                }
            }
        }
    }
}

fn decode_kafka_protocol(chunks: &[Bytes], t: &mut Tally) {
    for chunk in chunks {
        let mut buf = chunk.clone();
        while buf.has_remaining() {
            let set = RecordBatchDecoder::decode(&mut buf).expect("kafka-protocol: batch");
            for record in &set.records {
                touch(t, record.key.as_deref(), record.value.as_deref());
                for (k, v) in &record.headers {
                    touch_header(t, k.as_bytes(), v.as_deref());
                }
            }
        }
    }
}

/// Batch lengths, then record lengths; inside a record only what it takes to find the
/// key and the value. No CRC, no header parsing, no checks beyond slice bounds.
fn walk(chunks: &[Bytes], t: &mut Tally) {
    for chunk in chunks {
        let mut buf: &[u8] = chunk;
        while buf.len() >= 12 {
            let length = i32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
            let (batch, rest) = buf.split_at(12 + length);
            buf = rest;
            let mut records = &batch[BATCH_HEADER..];
            while !records.is_empty() {
                let len = walk_varint(&mut records) as usize;
                let (mut r, rest) = records.split_at(len);
                records = rest;
                r = &r[1..]; // attributes
                walk_varint(&mut r); // timestamp delta
                walk_varint(&mut r); // offset delta
                let key = walk_bytes(&mut r);
                let value = walk_bytes(&mut r);
                touch(t, key, value);
                touch_header(t, r, None);
            }
        }
    }
}

#[inline(always)]
fn walk_varint(b: &mut &[u8]) -> i64 {
    let mut raw = 0u64;
    let mut shift = 0;
    loop {
        let byte = b[0];
        *b = &b[1..];
        raw |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return ((raw >> 1) as i64) ^ -((raw & 1) as i64);
        }
        shift += 7;
    }
}

#[inline(always)]
fn walk_bytes<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = walk_varint(b);
    if len < 0 {
        return None;
    }
    let (out, rest) = b.split_at(len as usize);
    *b = rest;
    Some(out)
}

// ---------------------------------------------------------------------------------
// Timing

/// `(decoder, median ns/record, min ns/record)` for each measured decoder, walker first.
fn time_all(
    chunks: &[Bytes],
    runs: u64,
    target_ms: u64,
    reference: Tally,
) -> anyhow::Result<Vec<(Decoder, f64, f64)>> {
    // Warm up and size each decoder's loop to about `target_ms`.
    let mut iters = Vec::new();
    for d in Decoder::MEASURED {
        let start = Instant::now();
        let mut t = Tally::default();
        d.run(black_box(chunks), &mut t);
        let once = start.elapsed().max(Duration::from_micros(1));
        check_tally(d, t, reference)?;
        iters.push((Duration::from_millis(target_ms).as_nanos() / once.as_nanos()).max(1) as u64);
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); Decoder::MEASURED.len()];
    // Interleaved, so that drift (other work on shared cores) hits every decoder alike.
    for _ in 0..runs {
        for (i, d) in Decoder::MEASURED.into_iter().enumerate() {
            let mut t = Tally::default();
            let start = Instant::now();
            for _ in 0..iters[i] {
                d.run(black_box(chunks), &mut t);
            }
            let elapsed = start.elapsed();
            black_box(t);
            ensure!(
                t.records == reference.records * iters[i],
                "{} counted {} records in {} passes, expected {} per pass",
                d.name(),
                t.records,
                iters[i],
                reference.records
            );
            samples[i].push(elapsed.as_nanos() as f64 / t.records as f64);
        }
    }
    Ok(Decoder::MEASURED
        .into_iter()
        .zip(samples)
        .map(|(d, mut s)| {
            s.sort_by(f64::total_cmp);
            (d, s[s.len() / 2], s[0])
        })
        .collect())
}

/// Records and key+value bytes must match the reference (ottla's pass); header bytes too,
/// except for the walker, which does not parse headers.
fn check_tally(d: Decoder, t: Tally, reference: Tally) -> anyhow::Result<()> {
    let same = t.records == reference.records
        && t.kv == reference.kv
        && (d == Decoder::Walker || t.headers == reference.headers);
    ensure!(
        same,
        "{} saw {t:?}, ottla saw {reference:?} in one pass",
        d.name()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Callgrind

fn callgrind(input: &Path, iters: u64, reference: Tally) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("current_exe")?;
    let dir = work_dir()?;
    let stem = input
        .file_stem()
        .map_or("input".into(), |s| s.to_string_lossy().into_owned());
    let mut results = Vec::new();
    for d in [Decoder::None].into_iter().chain(Decoder::MEASURED) {
        let out_file = dir.join(format!("callgrind.{stem}.{}.out", d.name()));
        let output = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out_file.display()))
            .arg(&exe)
            .arg("--replay")
            .arg(input)
            .args(["--decoder", d.name(), "--iters", &iters.to_string()])
            .output()
            .context("running valgrind (is /usr/bin/valgrind installed?)")?;
        ensure!(
            output.status.success(),
            "valgrind {} failed: {}\n{}",
            d.name(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let field = |name: &str| {
            stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|v| v.parse::<u64>().ok())
        };
        let t = Tally {
            records: field("records=").context("replay printed no records=")?,
            kv: field("kv=").context("replay printed no kv=")?,
            headers: field("headers=").context("replay printed no headers=")?,
        };
        if d != Decoder::None {
            check_tally(d, t, reference)?;
        }
        let ir = total_ir(&out_file)?;
        results.push((d, ir, out_file));
    }
    let base = results[0].1;
    let records = (reference.records * iters) as f64;
    let per_record = |ir: u64| ir.saturating_sub(base) as f64 / records;
    let walker = per_record(results[1].1);
    println!();
    println!(
        "instructions per record (callgrind Ir, {iters} passes of {} records, minus the load-only baseline of {base} Ir)",
        reference.records
    );
    println!(
        "{:<26} {:>16} {:>12} {:>10}",
        "decoder", "Ir total", "Ir/record", "x walker"
    );
    for (d, ir, _) in &results {
        if *d == Decoder::None {
            println!("{:<26} {:>16} {:>12} {:>10}", d.label(), ir, "-", "-");
            continue;
        }
        println!(
            "{:<26} {:>16} {:>12.1} {:>9.2}x",
            d.label(),
            ir,
            per_record(*ir),
            per_record(*ir) / walker
        );
    }
    let crc = per_record(results[2].1) - per_record(results[3].1);
    println!(
        "CRC32C alone (ottla CRC on - off): {crc:.1} Ir/record = {:.2}x the walker; walker + CRC would be {:.2}x",
        crc / walker,
        (walker + crc) / walker
    );
    println!("profiles: callgrind_annotate {}", results[2].2.display());
    let ottla = per_record(results[2].1);
    targets::print(
        targets::DECODE_HEADING,
        &[
            Outcome::new(targets::DECODE, vec![(stem.clone(), ottla)]),
            Outcome::new(targets::DECODE_WALKER, vec![(stem, ottla / walker)]),
        ],
    );
    Ok(())
}

/// Total Ir from a callgrind output file's `summary:` (or `totals:`) line.
fn total_ir(file: &Path) -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary:").or(l.strip_prefix("totals:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no summary: or totals: line in {}", file.display()))
}

/// `--replay`: load the file, run one decoder `iters` times, print its per-pass tally.
fn replay(file: &Path, decoder: Decoder, iters: u64) -> anyhow::Result<()> {
    let input = Input::load(file)?;
    let mut first = None;
    for _ in 0..iters {
        let mut t = Tally::default();
        decoder.run(black_box(&input.chunks), &mut t);
        let t = black_box(t);
        ensure!(
            *first.get_or_insert(t) == t,
            "{} passes differ",
            decoder.name()
        );
    }
    let t = first.unwrap_or_default();
    println!(
        "decoder={} iters={iters} records={} kv={} headers={}",
        decoder.name(),
        t.records,
        t.kv,
        t.headers
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Input: capture, file format

/// Record-batch bytes, one chunk per Fetch response partition, and where they came from.
struct Input {
    source: String,
    chunks: Vec<Bytes>,
}

impl Input {
    /// `MAGIC`, then `u32` length-prefixed source description, `u32` chunk count, and
    /// `u32` length-prefixed chunks (big-endian).
    fn save(&self, path: &Path) -> anyhow::Result<()> {
        let mut out = BytesMut::new();
        out.put_slice(MAGIC);
        out.put_u32(self.source.len() as u32);
        out.put_slice(self.source.as_bytes());
        out.put_u32(self.chunks.len() as u32);
        for c in &self.chunks {
            out.put_u32(c.len() as u32);
            out.put_slice(c);
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, &out).with_context(|| format!("writing {}", path.display()))
    }

    /// Chunks are slices of one buffer, as a partition's records are of a response.
    fn load(path: &Path) -> anyhow::Result<Self> {
        let mut b = Bytes::from(
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        );
        ensure!(
            b.starts_with(MAGIC),
            "{} is not a bench-decode capture",
            path.display()
        );
        b.advance(MAGIC.len());
        let take = |b: &mut Bytes| -> anyhow::Result<Bytes> {
            ensure!(b.len() >= 4, "truncated capture");
            let n = b.get_u32() as usize;
            ensure!(b.len() >= n, "truncated capture");
            Ok(b.split_to(n))
        };
        let source = String::from_utf8(take(&mut b)?.to_vec())?;
        ensure!(b.len() >= 4, "truncated capture");
        let n = b.get_u32();
        let chunks = (0..n)
            .map(|_| take(&mut b))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { source, chunks })
    }

    /// Decodes every chunk once with ottla (CRC on): the input must be whole,
    /// uncompressed v2 batches. Returns one pass's tally.
    fn check(&self) -> anyhow::Result<Tally> {
        let mut t = Tally::default();
        for (i, chunk) in self.chunks.iter().enumerate() {
            let mut batches = Batches::new(chunk.clone(), BatchOptions::default());
            for batch in batches.by_ref() {
                let batch = batch.with_context(|| format!("chunk {i}"))?;
                ensure!(
                    batch.compression() == Compression::None,
                    "chunk {i}: compressed batch; the walker reads uncompressed batches only"
                );
                for r in batch.records() {
                    let r = r.with_context(|| format!("chunk {i}"))?;
                    touch(&mut t, r.key(), r.value());
                    for h in r.headers() {
                        touch_header(&mut t, h.key(), h.value());
                    }
                }
            }
            ensure!(
                batches.remaining() == 0,
                "chunk {i} ends in a partial batch"
            );
        }
        ensure!(t.records > 0, "the input holds no records");
        Ok(t)
    }

    fn summary(&self) -> anyhow::Result<String> {
        let bytes: usize = self.chunks.iter().map(Bytes::len).sum();
        let mut batches = 0u64;
        let mut records = 0u64;
        for chunk in &self.chunks {
            let mut at = 0;
            while let Some(head) = chunk.get(at..at + BATCH_HEADER) {
                let length = i32::from_be_bytes(head[8..12].try_into()?) as usize;
                records += i32::from_be_bytes(head[57..61].try_into()?) as u64;
                batches += 1;
                at += 12 + length;
            }
        }
        Ok(format!(
            "{} chunks (Fetch responses), {batches} batches, {records} records, {bytes} bytes: {:.1} records/batch, {:.1} bytes/record incl. batch headers",
            self.chunks.len(),
            records as f64 / batches.max(1) as f64,
            bytes as f64 / records.max(1) as f64
        ))
    }
}

fn capture(peer: &str, records: u64, batch_bytes: u64, partitions: i32) -> anyhow::Result<Input> {
    if peer == "encode" {
        return generate(records, batch_bytes);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(capture_from(peer, records, batch_bytes, partitions))
}

/// Key, value and header value of record `i`: a 15-byte key, a 100-byte value of
/// pseudo-random letters, a 16-byte hex trace id.
fn record_fields(i: u64) -> (String, Vec<u8>, String) {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let value = (0..VALUE_LEN).map(|_| b'a' + (next() % 26) as u8).collect();
    (format!("user-{i:010}"), value, format!("{:016x}", next()))
}

async fn capture_from(
    kind: &str,
    records: u64,
    batch_bytes: u64,
    partitions: i32,
) -> anyhow::Result<Input> {
    let peer = match kind {
        "mock" => Peer::mock(1)?,
        "tansu" => Peer::tansu()?,
        other => bail!("--peer {other}: expected mock, tansu or encode"),
    };
    peer.create_topic(TOPIC, partitions)?;
    let bootstrap = peer.bootstrap();

    let producer = protocol_tests::data::producer(
        &bootstrap,
        "none",
        &[("batch.size", &batch_bytes.to_string()), ("linger.ms", "5")],
    )?;
    let mut pending = Vec::with_capacity(records as usize);
    for i in 0..records {
        let (key, value, trace) = record_fields(i);
        let headers = OwnedHeaders::new().insert(Header {
            key: "trace-id",
            value: Some(trace.as_bytes()),
        });
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(TOPIC)
            .partition((i % partitions as u64) as i32)
            .key(key.as_bytes())
            .payload(&value[..])
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(delivery) => {
                    pending.push(delivery);
                    break;
                }
                Err((e, r)) => {
                    record = r;
                    ensure!(e.to_string().contains("Queue full"), "produce {i}: {e}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
    for (i, delivery) in pending.into_iter().enumerate() {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => bail!("record {i}: delivery failed: {e}"),
            Err(_) => bail!("record {i}: delivery cancelled"),
        }
    }
    producer.flush(Duration::from_secs(30))?;

    let config = ClientConfig::new(&bootstrap).with_request_timeout(Duration::from_secs(10));
    let scope = TopicScope::Topics([TOPIC.to_string()].into());
    let cluster = Cluster::connect(&config, scope, &[ApiKey::Fetch]).await?;
    let md = cluster.metadata();
    let topic = md.topic(TOPIC).context("topic not in metadata")?;
    let names = [(topic.id, TOPIC.to_string())].into();
    let mut fetch_version = 0;
    let params = FetchParams {
        max_wait_ms: 100,
        ..FetchParams::default()
    };
    let mut chunks = Vec::new();
    for partition in 0..partitions {
        let (leader, epoch) = md.leader(TOPIC, partition).context("no leader")?;
        let conn = cluster.broker(leader)?;
        let version = conn
            .versions()
            .await?
            .version(ApiKey::Fetch)
            .context("no Fetch version")?;
        fetch_version = version;
        let mut offset = 0i64;
        loop {
            let target = FetchTarget {
                topic: TOPIC.to_string(),
                topic_id: topic.id,
                partition,
                offset,
                leader_epoch: epoch.0,
                max_bytes: PARTITION_FETCH_BYTES,
            };
            let request = fetch_request(version, &params, &[target])?;
            let response = conn.send_version(&request, version).await?;
            let part = fetched_partitions(version, response, &names)
                .pop()
                .context("no partition in the Fetch response")?;
            ensure!(
                part.error == 0,
                "Fetch v{version} of partition {partition} at offset {offset}: error code {} \
                 (high watermark {}, log start {}; the mock keeps 5 MiB per partition: use more --partitions)",
                part.error,
                part.high_watermark,
                part.log_start_offset
            );
            if offset >= part.high_watermark {
                break;
            }
            let (whole, next) = whole_batches(&part.records);
            ensure!(
                whole > 0,
                "no whole batch at offset {offset} of partition {partition}"
            );
            chunks.push(part.records.slice(..whole));
            offset = next;
        }
    }
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    Ok(Input {
        source: format!(
            "captured: librdkafka {librdkafka} producer (batch.size {batch_bytes}, linger.ms 5, no compression, \
             {partitions} partitions, \
             key 15 B, value {VALUE_LEN} B, 1 header of 8+16 B) -> {} broker; fetched raw by ottla's Fetch v{fetch_version} \
             over its driver (max.partition.fetch.bytes {PARTITION_FETCH_BYTES}), one chunk per partition per response",
            peer.name()
        ),
        chunks,
    })
}

/// The length of the whole batches at the start of `records`, and the offset after them.
fn whole_batches(records: &Bytes) -> (usize, i64) {
    let mut at = 0;
    let mut next = 0;
    while let Some(head) = records.get(at..at + BATCH_HEADER) {
        let length = i32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
        if at + 12 + length > records.len() {
            break;
        }
        let base = i64::from_be_bytes(head[0..8].try_into().unwrap_or_default());
        let last_delta = i32::from_be_bytes([head[23], head[24], head[25], head[26]]);
        next = base + i64::from(last_delta) + 1;
        at += 12 + length;
    }
    (at, next)
}

/// `--peer encode`: the same records, batched by `encode_batch` up to about
/// `batch_bytes`, with base offsets set as a broker would, grouped into 1 MiB chunks.
fn generate(records: u64, batch_bytes: u64) -> anyhow::Result<Input> {
    let mut chunks = Vec::new();
    let mut chunk = BytesMut::new();
    let mut batch: Vec<OutRecord> = Vec::new();
    let mut size = 0;
    let mut offset = 0i64;
    let timestamp = 1_700_000_000_000i64;
    let mut flush = |batch: &mut Vec<OutRecord>, chunk: &mut BytesMut| -> anyhow::Result<()> {
        let encoded = encode_batch(batch, Compression::None, ProducerFields::NONE)?;
        let mut encoded = BytesMut::from(&encoded[..]);
        // The base offset is outside the CRC; the broker assigns it.
        encoded[0..8].copy_from_slice(&offset.to_be_bytes());
        offset += batch.len() as i64;
        if chunk.len() + encoded.len() > PARTITION_FETCH_BYTES as usize && !chunk.is_empty() {
            chunks.push(chunk.split().freeze());
        }
        chunk.put_slice(&encoded);
        batch.clear();
        Ok(())
    };
    for i in 0..records {
        let (key, value, trace) = record_fields(i);
        let record = OutRecord {
            timestamp: timestamp + i as i64 / 100,
            key: Some(key.into()),
            value: Some(value.into()),
            headers: vec![("trace-id".into(), Some(trace.into()))],
        };
        size += record.size_estimate();
        batch.push(record);
        if size >= batch_bytes as usize {
            flush(&mut batch, &mut chunk)?;
            size = 0;
        }
    }
    if !batch.is_empty() {
        flush(&mut batch, &mut chunk)?;
    }
    if !chunk.is_empty() {
        chunks.push(chunk.freeze());
    }
    Ok(Input {
        source: format!(
            "generated: ottla's encode_batch (batches of about {batch_bytes} B, no compression, \
             key 15 B, value {VALUE_LEN} B, 1 header of 8+16 B), 1 MiB chunks; no broker involved"
        ),
        chunks,
    })
}

// ---------------------------------------------------------------------------------
// Flags and paths

/// `--name VALUE` as a string.
fn sarg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// Whether `--name` was given.
fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// `<target>/bench-decode/`, next to the profile directory this binary was built in.
fn work_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("current_exe")?;
    let target = exe
        .parent()
        .and_then(Path::parent)
        .context("binary has no target directory")?;
    let dir = target.join("bench-decode");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
