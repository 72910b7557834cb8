//! The assignor ladder (issue 36): every built-in assignor called directly, on groups
//! from 10,000 partitions × 100 members up to Java's large-group shape, 1,000,000
//! partitions (500 topics × 2,000) × 2,000 members.
//!
//! ```sh
//! cargo run --release --example bench_assign -- [--max-partitions 1000000] [--runs 3]
//!     [--timeout-s 120] [--ladders uniform,overlap]
//!     [--assignors range,roundrobin,sticky,cooperative-sticky]
//! ```
//!
//! Two ladders, 500 topics each (partitions spread evenly over them):
//! - `uniform`: every member subscribes to every topic;
//! - `overlap`: even members subscribe to the first two thirds of the topics, odd
//!   members to the last two thirds (the middle third is shared);
//! - `windows` (not run unless named): member `i` subscribes to the 250 topics from
//!   topic `7i mod 500` on, wrapping: every topic has subscribers of its own;
//! - `racks` (not run unless named): `uniform`, with the members in three racks
//!   (KIP-881) and each partition's replicas on two of them.
//!
//! `--second join` makes the second round a scale-out instead: the first round has
//! the first half of the members, the second all of them, the new half owning nothing.
//!
//! Per cell and assignor, two rounds: the first with nothing owned; the second with
//! every member but the last reporting what the first round gave it, the way ottla's
//! members report it (owned partitions and generation for `cooperative-sticky`, the
//! `StickyAssignor` user data for the eager assignors, whose members have revoked
//! everything before they join), and the last member gone. Each round's time is the
//! median of at least `--runs` calls of `Assignor::assign` (more for cells under 0.3 s,
//! up to 51; only the call is timed). Each cell
//! runs in a child process of its own, so its peak memory is the child's `VmHWM` (from
//! `/proc/self/status`): the whole process, inputs and both rounds' results included.
//! A child that runs past `--timeout-s` is killed, and the larger cells of that
//! assignor and ladder are skipped.
//!
//! Also per cell: `spread`, the most minus the fewest partitions of a member after the
//! second round; `moved`, the partitions of the second round given to a member other
//! than their first-round owner (the gone member's excluded), and `held`, those the
//! second round assigns to nobody (cooperative: still held elsewhere). The growth
//! columns divide a cell's time by the previous cell's and print `n log n`'s ratio
//! beside it, with n the number of partitions.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ottla::consumer::TopicPartition;
use ottla::consumer::assignor::{
    Assignor, CooperativeStickyAssignor, MemberSubscription, PartitionRacks, RangeAssignor,
    RoundRobinAssignor, StickyAssignor, Subscription,
};

const TOPICS: usize = 500;
const CELLS: &[(usize, usize)] = &[
    (10_000, 100),
    (20_000, 200),
    (50_000, 500),
    (100_000, 1_000),
    (200_000, 2_000),
    (500_000, 2_000),
    (1_000_000, 2_000),
];

fn assignor(name: &str) -> Option<Box<dyn Assignor>> {
    match name {
        "range" => Some(Box::new(RangeAssignor)),
        "roundrobin" => Some(Box::new(RoundRobinAssignor)),
        "sticky" => Some(Box::new(StickyAssignor)),
        "cooperative-sticky" => Some(Box::new(CooperativeStickyAssignor)),
        _ => None,
    }
}

fn topic(t: usize) -> String {
    format!("topic-{t:03}")
}

fn group(
    ladder: &str,
    partitions: usize,
    members: usize,
) -> (BTreeMap<String, i32>, Vec<MemberSubscription>) {
    let per = partitions / TOPICS;
    let topics: BTreeMap<String, i32> = (0..TOPICS).map(|t| (topic(t), per as i32)).collect();
    let subscription = |i: usize| -> Vec<String> {
        match ladder {
            "overlap" if i % 2 == 0 => (0..TOPICS * 2 / 3).map(topic).collect(),
            "overlap" => (TOPICS / 3..TOPICS).map(topic).collect(),
            "windows" => (0..TOPICS / 2)
                .map(|k| topic((i * 7 + k) % TOPICS))
                .collect(),
            _ => (0..TOPICS).map(topic).collect(),
        }
    };
    let members = (0..members)
        .map(|i| MemberSubscription {
            member_id: format!("consumer-{i:05}"),
            instance_id: None,
            subscription: Subscription {
                topics: subscription(i),
                generation_id: -1,
                rack_id: (ladder == "racks").then(|| format!("rack-{}", i % 3)),
                ..Subscription::default()
            },
        })
        .collect();
    (topics, members)
}

/// The `racks` ladder's replicas: partition `p` of every topic on racks `p mod 3` and
/// `p + 1 mod 3` (so racks matter: no partition is on every rack).
fn racks(ladder: &str, topics: &BTreeMap<String, i32>) -> PartitionRacks {
    if ladder != "racks" {
        return PartitionRacks::new();
    }
    topics
        .iter()
        .flat_map(|(t, &n)| {
            (0..n).map(move |p| {
                let racks = [p % 3, (p + 1) % 3].map(|r| format!("rack-{r}"));
                (
                    TopicPartition::new(t.clone(), p),
                    racks.into_iter().collect(),
                )
            })
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The child: one cell, one assignor. Prints `first second hwm_kib spread moved held`.
fn run_cell(ladder: &str, partitions: usize, members: usize, name: &str, runs: usize, join: bool) {
    let a = assignor(name).expect("known assignor");
    let (topics, mut group) = group(ladder, partitions, members);
    let racks = racks(ladder, &topics);
    // At least `runs` calls, more for cheap cells (until 0.3 s or 51 calls), so that
    // the millisecond cells' medians are not one scheduler hiccup.
    let enough = |v: &Vec<f64>| v.len() >= runs && (v.iter().sum::<f64>() >= 0.3 || v.len() >= 51);
    // `--second join`: the first round has half the members, the second all of them
    // (a scale-out); otherwise the second round has one member fewer.
    let joiners = if join {
        group.split_off(group.len() / 2)
    } else {
        Vec::new()
    };
    let mut first = Vec::new();
    let mut r1 = BTreeMap::new();
    while !enough(&first) {
        let t = Instant::now();
        r1 = a
            .assign_with_racks(&topics, &racks, &group)
            .expect("assign");
        first.push(t.elapsed().as_secs_f64());
    }
    let gone = if join {
        MemberSubscription {
            member_id: String::new(),
            instance_id: None,
            subscription: Subscription::default(),
        }
    } else {
        group.pop().expect("a member")
    };
    for m in &mut group {
        let owned = r1[&m.member_id].partitions.clone();
        m.subscription.user_data = a.subscription_user_data(&owned, 1);
        m.subscription.generation_id = 1;
        if name == "cooperative-sticky" {
            m.subscription.owned_partitions = owned;
        }
    }
    group.extend(joiners);
    let mut second = Vec::new();
    let mut r2 = BTreeMap::new();
    while !enough(&second) {
        let t = Instant::now();
        r2 = a
            .assign_with_racks(&topics, &racks, &group)
            .expect("assign");
        second.push(t.elapsed().as_secs_f64());
    }
    let owner: BTreeMap<&TopicPartition, &str> = r1
        .iter()
        .filter(|(m, _)| **m != gone.member_id)
        .flat_map(|(m, a)| a.partitions.iter().map(move |p| (p, m.as_str())))
        .collect();
    let mut moved = 0;
    let mut assigned = 0;
    for (m, a) in &r2 {
        for p in &a.partitions {
            assigned += 1;
            if owner.get(p).is_some_and(|o| o != m) {
                moved += 1;
            }
        }
    }
    let loads: Vec<usize> = r2.values().map(|a| a.partitions.len()).collect();
    let spread = loads.iter().max().unwrap_or(&0) - loads.iter().min().unwrap_or(&0);
    let total: usize = topics
        .iter()
        .filter(|(t, _)| group.iter().any(|m| m.subscription.topics.contains(t)))
        .map(|(_, n)| *n as usize)
        .sum();
    println!(
        "{} {} {} {} {} {}",
        median(first),
        median(second),
        vm_hwm_kib(),
        spread,
        moved,
        total - assigned
    );
}

struct Row {
    first: f64,
    second: f64,
    partitions: usize,
}

fn nlogn(n: usize) -> f64 {
    n as f64 * (n as f64).log2()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(i) = args.iter().position(|a| a == "--cell") {
        let v = &args[i + 1..];
        run_cell(
            &v[0],
            v[1].parse().unwrap(),
            v[2].parse().unwrap(),
            &v[3],
            v[4].parse().unwrap(),
            v.get(5).is_some_and(|s| s == "join"),
        );
        return ExitCode::SUCCESS;
    }
    let max: usize =
        opt("--max-partitions").map_or(1_000_000, |v| v.parse().expect("--max-partitions N"));
    let runs: usize = opt("--runs").map_or(3, |v| v.parse().expect("--runs N"));
    let timeout =
        Duration::from_secs(opt("--timeout-s").map_or(120, |v| v.parse().expect("--timeout-s N")));
    let ladders = opt("--ladders").unwrap_or_else(|| "uniform,overlap".into());
    let second = opt("--second").unwrap_or_else(|| "gone".into());
    if second != "gone" && second != "join" {
        eprintln!("--second gone|join");
        return ExitCode::FAILURE;
    }
    let names =
        opt("--assignors").unwrap_or_else(|| "range,roundrobin,sticky,cooperative-sticky".into());
    for name in names.split(',') {
        if assignor(name).is_none() {
            eprintln!("unknown assignor {name}");
            return ExitCode::FAILURE;
        }
    }
    let exe = std::env::current_exe().expect("own path");
    println!(
        "# bench_assign: {TOPICS} topics, runs {runs} (median), timeout {} s per cell, max partitions {max}, second round: {}",
        timeout.as_secs(),
        if second == "join" {
            "half the members join"
        } else {
            "one member gone"
        }
    );
    println!(
        "# time: seconds in Assignor::assign; peak: the cell's child process VmHWM; growth: time / previous cell's time, beside n log n's ratio (n = partitions)"
    );
    println!();
    println!(
        "| ladder | partitions × members | assignor | first round | growth | second round | growth | n log n growth | peak MiB | spread | moved | held |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ladder in ladders.split(',') {
        for name in names.split(',') {
            let mut prev: Option<Row> = None;
            for &(partitions, members) in CELLS.iter().filter(|(p, _)| *p <= max) {
                let cell = format!("{partitions} × {members}");
                let mut child = Command::new(&exe)
                    .args([
                        "--cell",
                        ladder,
                        &partitions.to_string(),
                        &members.to_string(),
                        name,
                        &runs.to_string(),
                        &second,
                    ])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn a cell");
                let start = Instant::now();
                let status = loop {
                    if let Some(s) = child.try_wait().expect("wait") {
                        break Some(s);
                    }
                    if start.elapsed() > timeout {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                let mut out = String::new();
                if let Some(mut s) = child.stdout.take() {
                    let _ = s.read_to_string(&mut out);
                }
                let fields: Vec<&str> = out.split_whitespace().collect();
                if status.is_none_or(|s| !s.success()) || fields.len() != 6 {
                    println!(
                        "| {ladder} | {cell} | {name} | > {} s (killed) | | | | | | | | |",
                        timeout.as_secs()
                    );
                    break;
                }
                let first: f64 = fields[0].parse().unwrap_or(f64::NAN);
                let second: f64 = fields[1].parse().unwrap_or(f64::NAN);
                let hwm: f64 = fields[2].parse::<f64>().unwrap_or(f64::NAN) / 1024.0;
                let (g1, g2, gn) = match &prev {
                    Some(p) => (
                        format!("×{:.1}", first / p.first),
                        format!("×{:.1}", second / p.second),
                        format!("×{:.1}", nlogn(partitions) / nlogn(p.partitions)),
                    ),
                    None => (String::new(), String::new(), String::new()),
                };
                println!(
                    "| {ladder} | {cell} | {name} | {first:.3} s | {g1} | {second:.3} s | {g2} | {gn} | {hwm:.0} | {} | {} | {} |",
                    fields[3], fields[4], fields[5]
                );
                prev = Some(Row {
                    first,
                    second,
                    partitions,
                });
            }
        }
    }
    ExitCode::SUCCESS
}
