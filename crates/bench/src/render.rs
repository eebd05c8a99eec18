//! Human-readable tables for reports and comparisons.

use ember_training::Precision;

use crate::compare::Comparison;
use crate::report::{FigureKind, Report, ReportBody};

/// A plain-text table: a header row, a rule, and rows padded to column width. The first column is left-aligned
/// (names), the others right-aligned (numbers).
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are blank, extra cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in `\n`.
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let cell = |row: &[String], c: usize| row.get(c).cloned().unwrap_or_default();
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                let body = self.rows.iter().map(|r| cell(r, c).chars().count());
                body.chain([self.headers[c].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |row: &[String]| {
            let cells: Vec<String> = (0..cols)
                .map(|c| {
                    let text = cell(row, c);
                    if c == 0 {
                        format!("{text:<w$}", w = widths[c])
                    } else {
                        format!("{text:>w$}", w = widths[c])
                    }
                })
                .collect();
            format!("{}\n", cells.join("  ").trim_end())
        };
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        let mut out = line(&self.headers);
        out.push_str(&line(&rule));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// A figure's value with its unit: `12.35 ms`, `1234.5 tokens/s`, `512.0 MiB`.
pub fn format_value(name: &str, kind: FigureKind, value: f64) -> String {
    match kind {
        FigureKind::Time => format!("{value:.2} ms"),
        FigureKind::Memory => format!("{:.1} MiB", value / (1u64 << 20) as f64),
        FigureKind::Throughput if name.contains("mb_per_s") => format!("{value:.2} MB/s"),
        FigureKind::Throughput => format!("{value:.1} tokens/s"),
    }
}

/// A report as a readable table: a few context lines, then one row per figure.
pub fn render_report(report: &Report) -> String {
    let mut out = format!(
        "ember {} bench, {}\nmachine: {}\nbackend: {}, {} threads\n",
        report.body.kind(),
        report.timestamp,
        report.machine.summary(),
        report.backend,
        report.threads
    );
    match &report.body {
        ReportBody::Model(m) => {
            let s = &m.settings;
            out.push_str(&format!(
                "model: {} ({}, {} parameters, {}, weights {:.1} MiB)\nworkload: batch {}, prompt {} tokens, generate {} tokens, \
                 attention {}, quantize {}, {} runs after {} warm-up\n",
                m.model.name,
                m.model.architecture,
                m.model.parameters,
                m.model.dtype,
                m.model.weight_bytes as f64 / (1024.0 * 1024.0),
                s.batch,
                s.prompt_len,
                s.gen_len,
                s.attention,
                s.quantize.as_deref().unwrap_or("none"),
                s.runs,
                s.warmup
            ));
        }
        ReportBody::Kernels(k) => {
            let s = &k.settings;
            out.push_str(&format!(
                "shapes: batch {}, {} heads ({} kv), head_dim {}, {} runs after {} warm-up\n",
                s.batch, s.heads, s.kv_heads, s.head_dim, s.runs, s.warmup
            ));
        }
        ReportBody::Tokenizer(t) => out.push_str(&format!(
            "tokenizer: {}\ncorpus: {} ({} bytes, {} tokens), {} runs\n",
            t.tokenizer, t.corpus, t.corpus_bytes, t.tokens, t.runs
        )),
        ReportBody::Train(t) => {
            let s = &t.settings;
            out.push_str(&format!(
                "config: {} ({} parameters)\nworkload: batch {} x {} tokens{}, {} steps after {} warm-up, {}\n",
                s.config,
                t.parameters,
                s.batch,
                s.seq_len,
                if s.replicas > 1 {
                    format!(" split across {} data-parallel replicas", s.replicas)
                } else {
                    String::new()
                },
                s.steps,
                s.warmup,
                match s.precision {
                    Precision::F32 => "f32",
                    Precision::Bf16 => "bf16 compute, f32 master weights",
                }
            ));
        }
    }
    out.push('\n');
    let mut table = Table::new(&["figure", "value"]);
    for f in report.figures() {
        table.row(vec![f.name.clone(), format_value(&f.name, f.kind, f.value)]);
    }
    out.push_str(&table.render());
    out
}

/// A comparison as a table: old and new value, relative change and verdict per figure, then warnings.
pub fn render_comparison(cmp: &Comparison) -> String {
    let mut table = Table::new(&["figure", "old", "new", "change", "verdict"]);
    for f in &cmp.figures {
        table.row(vec![
            f.name.clone(),
            format_value(&f.name, f.kind, f.old),
            format_value(&f.name, f.kind, f.new),
            format!("{:+.1}%", f.change * 100.0),
            f.verdict_words().to_string(),
        ]);
    }
    let mut out = format!("noise threshold: ±{:.1}%\n\n", cmp.noise_threshold * 100.0);
    out.push_str(&table.render());
    for name in &cmp.unmatched {
        out.push_str(&format!("note: {name} is in only one of the reports\n"));
    }
    for w in &cmp.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pads_columns_and_right_aligns_numbers() {
        let mut t = Table::new(&["figure", "value"]);
        t.row(vec!["ttft_ms".into(), "1.50 ms".into()]);
        t.row(vec!["decode_latency_ms.p99".into(), "12.00 ms".into()]);
        let want = "figure                    value\n\
                    ---------------------  --------\n\
                    ttft_ms                 1.50 ms\n\
                    decode_latency_ms.p99  12.00 ms\n";
        assert_eq!(t.render(), want);
    }

    #[test]
    fn values_carry_their_unit() {
        assert_eq!(
            format_value("ttft_ms", FigureKind::Time, 12.346),
            "12.35 ms"
        );
        assert_eq!(
            format_value("peak_memory_bytes", FigureKind::Memory, 3.0 * 1048576.0),
            "3.0 MiB"
        );
        assert_eq!(
            format_value("encode_mb_per_s", FigureKind::Throughput, 4.5),
            "4.50 MB/s"
        );
        assert_eq!(
            format_value("decode_tokens_per_s", FigureKind::Throughput, 99.94),
            "99.9 tokens/s"
        );
    }
}
