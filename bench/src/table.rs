//! Samples, medians and the printed table.

use super::{Cell, Client};

/// One child's figures.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Records counted.
    pub records: u64,
    /// Key and value bytes counted.
    pub bytes: u64,
    /// Seconds from the child's start to its first record.
    pub first: f64,
    /// Seconds from the child's start to its last record.
    pub last: f64,
    /// Duplicates, gaps and records past the end.
    pub bad: u64,
    /// User + system CPU seconds of the whole child (rusage).
    pub cpu: f64,
    /// Peak RSS of the child, MiB (its `VmHWM`).
    pub rss_mib: f64,
    /// Seconds from the child's start to its assignment, where the child reports it.
    pub assigned: Option<f64>,
}

impl Sample {
    /// From the first record to the last.
    pub fn secs(&self) -> f64 {
        (self.last - self.first).max(1e-6)
    }

    /// Records per second, first record to last.
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.secs()
    }

    /// Key and value megabytes (10^6) per second, first record to last.
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.secs()
    }

    /// CPU seconds of the whole process per million records.
    pub fn cpu_per_million(&self) -> f64 {
        self.cpu * 1e6 / self.records.max(1) as f64
    }
}

/// One client on one cell of one broker.
#[derive(Debug, Clone)]
pub struct Row {
    /// `mock` or `tansu`.
    pub broker: &'static str,
    /// The data.
    pub cell: Cell,
    /// The client.
    pub client: Client,
    /// Why it has no figures (or stopped having them), if so.
    pub failure: Option<String>,
    /// A note on the cell (the mock's cap).
    pub note: String,
    /// One per successful run.
    pub samples: Vec<Sample>,
}

impl Row {
    /// A row waiting for samples.
    pub fn new(broker: &'static str, cell: Cell, client: Client, note: &str) -> Self {
        Self {
            broker,
            cell,
            client,
            failure: None,
            note: note.to_string(),
            samples: Vec::new(),
        }
    }

    /// A row that cannot run.
    pub fn failed(
        broker: &'static str,
        cell: Cell,
        client: Client,
        reason: &str,
        note: &str,
    ) -> Self {
        let mut row = Row::new(broker, cell, client, note);
        row.failure = Some(reason.to_string());
        row
    }

    /// The median of `f` over the samples.
    pub fn median(&self, f: fn(&Sample) -> f64) -> Option<f64> {
        let mut v: Vec<f64> = self.samples.iter().map(f).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// Whether the row has figures to show.
    pub fn usable(&self) -> bool {
        self.failure.is_none() && !self.samples.is_empty()
    }
}

/// Prints one table per (broker, cell) in `rows`, in order.
pub fn print(rows: &[Row]) {
    let mut i = 0;
    while i < rows.len() {
        let (broker, cell) = (rows[i].broker, rows[i].cell);
        let end = rows[i..]
            .iter()
            .position(|r| r.broker != broker || r.cell != cell)
            .map_or(rows.len(), |n| i + n);
        print_cell(&rows[i..end]);
        i = end;
    }
}

fn print_cell(rows: &[Row]) {
    let Some(head) = rows.first() else {
        return;
    };
    let cell = head.cell;
    let runs = rows.iter().map(|r| r.samples.len()).max().unwrap_or(0);
    println!();
    println!(
        "== {} · {} values{} · {} partitions · {} records · median of {} run{}{}",
        head.broker,
        super::size_label(cell.value_size),
        if cell.lz4 { ", lz4" } else { ", uncompressed" },
        cell.partitions,
        cell.records,
        runs,
        if runs == 1 { "" } else { "s" },
        if head.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", head.note)
        }
    );
    println!(
        "{:<18} {:>11} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "client", "records/s", "MB/s", "CPU s/M", "RSS MiB", "1st rec", "×rd rec/s", "×rd CPU"
    );
    let reference = rows
        .iter()
        .find(|r| r.client == Client::REFERENCE && r.usable());
    let ref_rate = reference.and_then(|r| r.median(Sample::records_per_sec));
    let ref_cpu = reference.and_then(|r| r.median(Sample::cpu_per_million));
    for row in rows {
        if !row.usable() {
            println!(
                "{:<18} {}",
                row.client.name(),
                row.failure.as_deref().unwrap_or("n/a: no run")
            );
            continue;
        }
        let m = |f: fn(&Sample) -> f64| row.median(f).unwrap_or(f64::NAN);
        let rate = m(Sample::records_per_sec);
        let cpu = m(Sample::cpu_per_million);
        let ratio = |a: f64, b: Option<f64>| match b {
            Some(b) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".to_string(),
        };
        println!(
            "{:<18} {:>11.0} {:>8.1} {:>9.3} {:>8.1} {:>7.2}s {:>9} {:>9}",
            row.client.name(),
            rate,
            m(Sample::mb_per_sec),
            cpu,
            m(|s| s.rss_mib),
            m(|s| s.first),
            ratio(rate, ref_rate),
            ratio(cpu, ref_cpu),
        );
    }
}

/// What the columns mean and how each client is set up.
pub fn legend(clients: &[Client]) {
    println!("columns:");
    println!(
        "  records/s, MB/s  from the child's first record to its last (MB: key + value bytes, 10^6)"
    );
    println!(
        "  CPU s/M          user + system CPU seconds of the whole child process (rusage, wait4) per million records"
    );
    println!(
        "  RSS MiB          the child's peak resident set (its VmHWM at exit; ru_maxrss would include the parent's size, which Linux keeps across execve)"
    );
    println!(
        "  1st rec          seconds from the child's start to its first record (connect, group join)"
    );
    println!(
        "  ×rd              ratio to {} (records/s: higher is better; CPU: lower is better)",
        Client::REFERENCE.name()
    );
    println!("clients (each in its own process, run in this order in every round):");
    for c in clients {
        println!("  {:<18} {}", c.name(), c.mode());
    }
    println!(
        "  async clients run on a tokio multi-thread runtime with its default worker count; fetch limits are the defaults everywhere (1 MiB per partition, 50 MiB per fetch, 500 ms max wait)"
    );
}
