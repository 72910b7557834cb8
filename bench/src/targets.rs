//! Issue 21's targets, with issue 36's bounds for `recv()`, `Processor::run` and
//! `run_batch`, from the medians of one run: a figure per cell (mostly a ratio of two
//! clients' medians in that cell), the worst cell, how many cells meet the bound, and
//! whether the target is met.
//!
//! `bench` builds the consume targets from its rows ([`evaluate`]) and prints them last
//! ([`print`]); `bench-decode --callgrind` builds the decode targets from its instruction
//! counts ([`Outcome::new`]) and prints them the same way. A target none of whose cells
//! ran (say, `--clients` without rskafka) is "not measured", not met or unmet.

use super::table::{Row, Sample};
use super::{Cell, Client};

/// What is measured in each cell, and the bound every cell must keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// The figure, and the cells it is taken in.
    pub what: &'static str,
    /// The bound every measured cell must keep.
    pub bound: Bound,
    /// How the figures print.
    pub unit: Unit,
}

/// `recv()`'s CPU per record over `recv_batch`'s, in the uncompressed 100 B cells
/// (issue 36; issue 21 asked ≤ 1.25× in every cell).
pub const RECV: Target = Target {
    what: "recv() ÷ recv_batch CPU per record, 100 B cells",
    bound: Bound::AtMost(1.3),
    unit: Unit::Ratio,
};

/// `Processor::run` (no-op handler) CPU per record over the raw stream's (`recv_batch`),
/// in the uncompressed 100 B cells (issue 36; issue 21 asked ≤ 1.3×).
pub const RUN: Target = Target {
    what: "Processor::run no-op ÷ raw stream CPU, 100 B cells",
    bound: Bound::AtMost(1.5),
    unit: Unit::Ratio,
};

/// `Processor::run_batch` (no-op handler) CPU per record over the raw stream's, in the
/// uncompressed 100 B cells (issue 36; issue 21 asked ≤ 1.1×).
pub const RUN_BATCH: Target = Target {
    what: "Processor::run_batch no-op ÷ raw stream CPU, 100 B cells",
    bound: Bound::AtMost(1.2),
    unit: Unit::Ratio,
};

/// ottla's (`recv_batch`) records per second, first record to last, over rskafka's, in
/// tansu's uncompressed 100 B and 1 KiB cells with 6 partitions.
pub const THROUGHPUT: Target = Target {
    what: "ottla ÷ rskafka records/s, tansu 6p, 100 B and 1 KiB",
    bound: Bound::AtLeast(1.0),
    unit: Unit::Ratio,
};

/// ottla's (`recv_batch`) CPU per record over the cheapest peer's, in every cell with
/// ottla and a peer: ottla is the cheapest client everywhere (a tie counts as cheapest).
/// Peers are the other libraries; ottla's other ways of consuming are not peers.
pub const CHEAPEST: Target = Target {
    what: "ottla ÷ cheapest peer CPU per record, every cell",
    bound: Bound::AtMost(1.0),
    unit: Unit::Ratio,
};

/// Instructions per record of ottla's decoder with CRC checks on (`bench-decode
/// --callgrind`).
pub const DECODE: Target = Target {
    what: "decode instructions per record, CRC on",
    bound: Bound::AtMost(500.0),
    unit: Unit::Instructions,
};

/// [`DECODE`]'s instructions per record over the length-only walker's.
pub const DECODE_WALKER: Target = Target {
    what: "decode instructions, CRC on ÷ length walker's",
    bound: Bound::AtMost(2.6),
    unit: Unit::Ratio,
};

/// The consume targets ([`RECV`], [`RUN`], [`RUN_BATCH`], [`THROUGHPUT`], [`CHEAPEST`])
/// from `rows`, the rows of one run (several brokers' cells may be in it). A cell counts
/// for a target only where every client the figure needs has usable samples.
pub fn evaluate(rows: &[Row]) -> Vec<Outcome> {
    let cells = group(rows);
    let hundred = |_: &str, c: &Cell| c.value_size == 100 && !c.lz4;
    let tansu_6p = |broker: &str, c: &Cell| {
        broker == "tansu" && c.partitions == 6 && !c.lz4 && matches!(c.value_size, 100 | 1024)
    };
    let cpu = Sample::cpu_per_million;
    vec![
        ratio(RECV, &cells, hundred, Client::OttlaRecv, Client::Ottla, cpu),
        ratio(RUN, &cells, hundred, Client::OttlaProc, Client::Ottla, cpu),
        ratio(
            RUN_BATCH,
            &cells,
            hundred,
            Client::OttlaProcBatch,
            Client::Ottla,
            cpu,
        ),
        ratio(
            THROUGHPUT,
            &cells,
            tansu_6p,
            Client::Ottla,
            Client::Rskafka,
            Sample::records_per_sec,
        ),
        cheapest(&cells),
    ]
}

/// The heading of `bench`'s targets.
pub const CONSUME_HEADING: &str =
    "Targets (issue 21, with issue 36's bounds for recv, run and run_batch)";

/// The heading of `bench-decode`'s targets.
pub const DECODE_HEADING: &str = "Targets (issue 21)";

/// Prints `outcomes` under `heading`, one line each.
pub fn print(heading: &str, outcomes: &[Outcome]) {
    println!();
    print!("{}", render(heading, outcomes));
}

/// The lines [`print`] prints: a heading, a column header, one line per outcome (its
/// target, bound, worst figure, cells that meet the bound out of those measured, verdict
/// and worst cell) and a note on the columns.
pub fn render(heading: &str, outcomes: &[Outcome]) -> String {
    let width = outcomes
        .iter()
        .map(|o| o.target.what.chars().count())
        .max()
        .unwrap_or(0)
        .max("target".len());
    let mut out = format!("==== {heading} ====\n");
    out += &format!(
        "{:<width$}  {:<8}  {:>7}  {:>9}  {:<12}  {}\n",
        "target", "bound", "worst", "cells met", "verdict", "worst cell"
    );
    for o in outcomes {
        let t = o.target;
        let (worst, cells, cell) = match o.worst() {
            Some((cell, figure)) => (
                t.unit.format(figure),
                format!("{} of {}", o.met(), o.cells.len()),
                cell,
            ),
            None => ("-".into(), "-".into(), ""),
        };
        let line = format!(
            "{:<width$}  {:<8}  {:>7}  {:>9}  {:<12}  {cell}",
            t.what,
            t.bound.format(t.unit),
            worst,
            cells,
            o.verdict().name(),
        );
        out += line.trim_end();
        out.push('\n');
    }
    out += "(worst: the cell farthest on the wrong side of the bound; cells met: cells within it, of those measured)\n";
    out
}

/// A target and the figure of every cell measured for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The target.
    pub target: Target,
    /// Each measured cell's label (`tansu 100B/6p`) and figure, in the run's order.
    pub cells: Vec<(String, f64)>,
}

impl Outcome {
    /// `target` measured in `cells` (label and figure each); none: not measured.
    pub fn new(target: Target, cells: Vec<(String, f64)>) -> Self {
        Self { target, cells }
    }

    /// The cell farthest on the wrong side of the bound (the largest figure under
    /// [`Bound::AtMost`], the smallest under [`Bound::AtLeast`]); the first of equals.
    pub fn worst(&self) -> Option<(&str, f64)> {
        let mut worst: Option<(&str, f64)> = None;
        for (cell, figure) in &self.cells {
            let worse = match (worst, self.target.bound) {
                (None, _) => true,
                (Some((_, w)), Bound::AtMost(_)) => *figure > w,
                (Some((_, w)), Bound::AtLeast(_)) => *figure < w,
            };
            if worse {
                worst = Some((cell, *figure));
            }
        }
        worst
    }

    /// How many measured cells keep the bound.
    pub fn met(&self) -> usize {
        self.cells
            .iter()
            .filter(|(_, figure)| self.target.bound.keeps(*figure))
            .count()
    }

    /// Met when every measured cell keeps the bound; not measured without a cell.
    pub fn verdict(&self) -> Verdict {
        if self.cells.is_empty() {
            Verdict::NotMeasured
        } else if self.met() == self.cells.len() {
            Verdict::Met
        } else {
            Verdict::NotMet
        }
    }
}

/// Where a target stands after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every measured cell keeps the bound.
    Met,
    /// Some measured cell does not.
    NotMet,
    /// No cell had the clients the figure needs.
    NotMeasured,
}

impl Verdict {
    /// `met`, `not met`, `not measured`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::NotMet => "not met",
            Verdict::NotMeasured => "not measured",
        }
    }
}

/// The bound a cell's figure must keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// At most this much (costs).
    AtMost(f64),
    /// At least this much (throughput).
    AtLeast(f64),
}

impl Bound {
    /// Whether `figure` keeps the bound.
    pub fn keeps(self, figure: f64) -> bool {
        match self {
            Bound::AtMost(limit) => figure <= limit,
            Bound::AtLeast(limit) => figure >= limit,
        }
    }

    /// `≤ 1.25×`, `≥ 1.00×`, `≤ 500 Ir`.
    pub fn format(self, unit: Unit) -> String {
        match self {
            Bound::AtMost(limit) => format!("≤ {}", unit.format(limit)),
            Bound::AtLeast(limit) => format!("≥ {}", unit.format(limit)),
        }
    }
}

/// How a target's figures print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A ratio: `1.61×`.
    Ratio,
    /// Instructions per record: `1055 Ir`.
    Instructions,
}

impl Unit {
    /// `figure` in this unit.
    pub fn format(self, figure: f64) -> String {
        match self {
            Unit::Ratio => format!("{figure:.2}×"),
            Unit::Instructions => format!("{figure:.0} Ir"),
        }
    }
}

/// One broker's cell and its rows.
struct CellRows<'a> {
    broker: &'static str,
    cell: Cell,
    rows: Vec<&'a Row>,
}

impl CellRows<'_> {
    /// `tansu 100B/6p`.
    fn label(&self) -> String {
        format!("{} {}", self.broker, self.cell.label())
    }

    /// `client`'s median of `f`, if it has usable samples and the median is a positive
    /// number (a ratio's denominator must be).
    fn median(&self, client: Client, f: fn(&Sample) -> f64) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.client == client && r.usable())
            .and_then(|r| r.median(f))
            .filter(|m| m.is_finite() && *m > 0.0)
    }
}

/// `rows` by broker and cell, in the order each first appears.
fn group(rows: &[Row]) -> Vec<CellRows<'_>> {
    let mut cells: Vec<CellRows<'_>> = Vec::new();
    for row in rows {
        match cells
            .iter_mut()
            .find(|c| c.broker == row.broker && c.cell == row.cell)
        {
            Some(c) => c.rows.push(row),
            None => cells.push(CellRows {
                broker: row.broker,
                cell: row.cell,
                rows: vec![row],
            }),
        }
    }
    cells
}

/// `target` as `over`'s median of `f` divided by `under`'s, in each cell `keep` takes
/// (by broker and cell) where both have one.
fn ratio(
    target: Target,
    cells: &[CellRows<'_>],
    keep: impl Fn(&str, &Cell) -> bool,
    over: Client,
    under: Client,
    f: fn(&Sample) -> f64,
) -> Outcome {
    let figures = cells
        .iter()
        .filter(|c| keep(c.broker, &c.cell))
        .filter_map(|c| Some((c.label(), c.median(over, f)? / c.median(under, f)?)))
        .collect();
    Outcome::new(target, figures)
}

/// [`CHEAPEST`]: in each cell with ottla and at least one peer, ottla's CPU per record
/// over the cheapest peer's; the cell's label names that peer.
fn cheapest(cells: &[CellRows<'_>]) -> Outcome {
    let cpu = Sample::cpu_per_million;
    let figures = cells
        .iter()
        .filter_map(|c| {
            let ottla = c.median(Client::Ottla, cpu)?;
            let (peer, least) = c
                .rows
                .iter()
                .filter(|r| is_peer(r.client))
                .filter_map(|r| Some((r.client, c.median(r.client, cpu)?)))
                .min_by(|a, b| a.1.total_cmp(&b.1))?;
            Some((format!("{} vs {}", c.label(), peer.name()), ottla / least))
        })
        .collect();
    Outcome::new(CHEAPEST, figures)
}

/// Whether `client` is another library, not one of ottla's ways of consuming.
fn is_peer(client: Client) -> bool {
    match client {
        Client::Ottla
        | Client::OttlaShortWait
        | Client::OttlaRecv
        | Client::OttlaProc
        | Client::OttlaProcBatch => false,
        Client::RdBase
        | Client::RdBaseDefault
        | Client::RdStream
        | Client::Rskafka
        | Client::Krafka
        | Client::Confluent => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MILLION: u64 = 1_000_000;

    /// A row of one sample of a million records: `cpu` CPU seconds per million records,
    /// `rate` records per second.
    fn row(broker: &'static str, cell: Cell, client: Client, cpu: f64, rate: f64) -> Row {
        let mut row = Row::new(broker, cell, client, "");
        row.samples.push(Sample {
            records: MILLION,
            bytes: MILLION * cell.value_size as u64,
            first: 1.0,
            last: 1.0 + MILLION as f64 / rate,
            bad: 0,
            cpu,
            rss_mib: 30.0,
            assigned: None,
        });
        row
    }

    fn cell(value_size: usize, lz4: bool, partitions: i32) -> Cell {
        Cell {
            value_size,
            lz4,
            partitions,
            records: MILLION,
        }
    }

    fn outcome(rows: &[Row], target: Target) -> Outcome {
        evaluate(rows)
            .into_iter()
            .find(|o| o.target == target)
            .expect("every consume target is evaluated")
    }

    /// The figures, rounded to two decimals, with their cells.
    fn figures(o: &Outcome) -> Vec<(String, f64)> {
        o.cells
            .iter()
            .map(|(c, f)| (c.clone(), round(*f)))
            .collect()
    }

    /// The worst cell and its figure, rounded to two decimals.
    fn worst(o: &Outcome) -> Option<(&str, f64)> {
        o.worst().map(|(c, f)| (c, round(f)))
    }

    /// Ratios of medians are not exact in floating point.
    fn round(figure: f64) -> f64 {
        (figure * 100.0).round() / 100.0
    }

    #[test]
    fn recv_is_measured_in_the_100_b_cells_with_both_clients_and_the_worst_cell_decides() {
        let (small, big, many) = (
            cell(100, false, 6),
            cell(1024, false, 6),
            cell(100, false, 24),
        );
        let rows = [
            row("tansu", small, Client::Ottla, 0.2, 3e6),
            row("tansu", small, Client::OttlaRecv, 0.24, 3e6),
            // Not the target's: 1 KiB.
            row("tansu", big, Client::Ottla, 0.4, 6e5),
            row("tansu", big, Client::OttlaRecv, 0.6, 6e5),
            row("tansu", many, Client::Ottla, 0.2, 3e6),
            row("tansu", many, Client::OttlaRecv, 0.3, 3e6),
            row("mock", small, Client::Ottla, 0.2, 3e6),
            row("mock", small, Client::OttlaRecv, 0.2, 3e6),
        ];
        let o = outcome(&rows, RECV);
        assert_eq!(
            figures(&o),
            [
                ("tansu 100B/6p".to_string(), 1.2),
                ("tansu 100B/24p".to_string(), 1.5),
                ("mock 100B/6p".to_string(), 1.0),
            ]
        );
        assert_eq!(worst(&o), Some(("tansu 100B/24p", 1.5)));
        assert_eq!(o.met(), 2);
        assert_eq!(o.verdict(), Verdict::NotMet);
    }

    #[test]
    fn a_cell_missing_a_client_or_whose_client_failed_is_left_out() {
        let (a, b, c) = (
            cell(100, false, 1),
            cell(100, false, 6),
            cell(100, false, 24),
        );
        let mut failed = row("tansu", c, Client::OttlaRecv, 0.9, 1e6);
        failed.failure = Some("n/a: counted 10 of 1000000 records".into());
        let rows = [
            row("tansu", a, Client::Ottla, 0.2, 3e6),
            row("tansu", a, Client::OttlaRecv, 0.26, 3e6),
            // No recv() row in b.
            row("tansu", b, Client::Ottla, 0.2, 3e6),
            row("tansu", c, Client::Ottla, 0.2, 3e6),
            failed,
        ];
        let o = outcome(&rows, RECV);
        assert_eq!(figures(&o), [("tansu 100B/1p".to_string(), 1.3)]);
        assert_eq!((o.met(), o.cells.len()), (1, 1));
        // Exactly at the bound is within it.
        assert_eq!(o.verdict(), Verdict::Met);
    }

    #[test]
    fn the_processor_targets_take_the_uncompressed_100_b_cells_only() {
        let (small, big, lz4) = (
            cell(100, false, 6),
            cell(1024, false, 6),
            cell(1024, true, 6),
        );
        let mut rows = Vec::new();
        for (c, proc_cpu, batch_cpu) in [(small, 0.29, 0.23), (big, 0.8, 0.8), (lz4, 0.8, 0.8)] {
            rows.push(row("tansu", c, Client::Ottla, 0.2, 3e6));
            rows.push(row("tansu", c, Client::OttlaProc, proc_cpu, 2e6));
            rows.push(row("tansu", c, Client::OttlaProcBatch, batch_cpu, 2e6));
        }
        let run = outcome(&rows, RUN);
        assert_eq!(figures(&run), [("tansu 100B/6p".to_string(), 1.45)]);
        assert_eq!(run.verdict(), Verdict::Met);
        let batch = outcome(&rows, RUN_BATCH);
        assert_eq!(figures(&batch), [("tansu 100B/6p".to_string(), 1.15)]);
        assert_eq!(batch.verdict(), Verdict::Met);
    }

    #[test]
    fn throughput_is_against_rskafka_on_tansu_6_partitions_and_its_worst_is_the_lowest() {
        let rows = [
            row("tansu", cell(100, false, 6), Client::Ottla, 0.2, 3e6),
            row("tansu", cell(100, false, 6), Client::Rskafka, 0.7, 2.5e6),
            row("tansu", cell(1024, false, 6), Client::Ottla, 0.4, 5.4e5),
            row("tansu", cell(1024, false, 6), Client::Rskafka, 0.7, 6e5),
            // Not the target's cells: another partition count, lz4, the mock.
            row("tansu", cell(100, false, 1), Client::Ottla, 0.2, 1e5),
            row("tansu", cell(100, false, 1), Client::Rskafka, 0.7, 1e6),
            row("tansu", cell(1024, true, 6), Client::Ottla, 0.2, 1e5),
            row("tansu", cell(1024, true, 6), Client::Rskafka, 0.7, 1e6),
            row("mock", cell(100, false, 6), Client::Ottla, 0.2, 1e5),
            row("mock", cell(100, false, 6), Client::Rskafka, 0.7, 1e6),
        ];
        let o = outcome(&rows, THROUGHPUT);
        assert_eq!(
            figures(&o),
            [
                ("tansu 100B/6p".to_string(), 1.2),
                ("tansu 1KiB/6p".to_string(), 0.9)
            ]
        );
        assert_eq!(worst(&o), Some(("tansu 1KiB/6p", 0.9)));
        assert_eq!((o.met(), o.cells.len()), (1, 2));
        assert_eq!(o.verdict(), Verdict::NotMet);
    }

    #[test]
    fn a_target_whose_clients_did_not_run_is_not_measured() {
        // A run with --clients ottla,ottla-recv: no rskafka, no Processor, no peer.
        let c = cell(100, false, 6);
        let rows = [
            row("tansu", c, Client::Ottla, 0.2, 3e6),
            row("tansu", c, Client::OttlaRecv, 0.3, 3e6),
        ];
        let outcomes = evaluate(&rows);
        let verdicts: Vec<Verdict> = outcomes.iter().map(Outcome::verdict).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::NotMet,
                Verdict::NotMeasured,
                Verdict::NotMeasured,
                Verdict::NotMeasured,
                Verdict::NotMeasured,
            ]
        );
        let not_measured = &outcomes[3];
        assert_eq!((not_measured.worst(), not_measured.met()), (None, 0));
    }

    #[test]
    fn ottla_is_compared_with_the_cheapest_peer_and_not_with_its_own_variants() {
        let (a, b) = (cell(100, false, 6), cell(1024, false, 6));
        let mut failed_krafka = row("tansu", b, Client::Krafka, 0.1, 1e6);
        failed_krafka.failure = Some("n/a: killed at the time limit".into());
        let rows = [
            row("tansu", a, Client::RdBase, 0.44, 2.4e6),
            row("tansu", a, Client::Ottla, 0.16, 3.9e6),
            // Cheaper than the raw stream, but ottla's own.
            row("tansu", a, Client::OttlaRecv, 0.1, 3.5e6),
            row("tansu", a, Client::Rskafka, 0.7, 3e6),
            row("tansu", b, Client::RdBase, 0.54, 6e5),
            row("tansu", b, Client::Ottla, 0.42, 6e5),
            row("tansu", b, Client::Krafka, 0.35, 5e5),
            failed_krafka,
            row("tansu", b, Client::Rskafka, 0.7, 6e5),
            // Only ottla: no peer to compare with.
            row("mock", a, Client::Ottla, 0.16, 3.9e6),
        ];
        let o = outcome(&rows, CHEAPEST);
        assert_eq!(
            figures(&o),
            [
                ("tansu 100B/6p vs rdkafka-base".to_string(), 0.36),
                ("tansu 1KiB/6p vs krafka".to_string(), 1.2),
            ]
        );
        assert_eq!(worst(&o), Some(("tansu 1KiB/6p vs krafka", 1.2)));
        assert_eq!((o.met(), o.cells.len()), (1, 2));
        assert_eq!(o.verdict(), Verdict::NotMet);
    }

    #[test]
    fn the_table_prints_the_worst_figure_the_count_and_the_verdict() {
        let outcomes = [
            Outcome::new(RECV, vec![("tansu 100B/6p".into(), 1.61)]),
            Outcome::new(THROUGHPUT, Vec::new()),
            Outcome::new(
                DECODE,
                vec![
                    ("records-mock".into(), 480.4),
                    ("records-tansu".into(), 455.0),
                ],
            ),
        ];
        let text = render(CONSUME_HEADING, &outcomes);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "==== Targets (issue 21, with issue 36's bounds for recv, run and run_batch) ===="
        );
        let words = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words(lines[2]).ends_with("≤ 1.30× 1.61× 0 of 1 not met tansu 100B/6p"),
            "{}",
            lines[2]
        );
        assert!(
            words(lines[3]).ends_with("≥ 1.00× - - not measured"),
            "{}",
            lines[3]
        );
        assert!(
            words(lines[4]).ends_with("≤ 500 Ir 480 Ir 2 of 2 met records-mock"),
            "{}",
            lines[4]
        );
        // The columns line up whatever the targets' names.
        let column = |line: &str| line.chars().position(|c| c == '≤' || c == '≥');
        assert_eq!(column(lines[2]), column(lines[3]));
        assert_eq!(column(lines[3]), column(lines[4]));
    }
}
