//! Comparing two reports figure by figure, with a verdict against a noise threshold.

use crate::BenchError;
use crate::report::{Figure, FigureKind, Report};

/// The verdict on one figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Better than the old report by more than the noise threshold.
    Improved,
    /// Worse than the old report by more than the noise threshold.
    Regressed,
    /// The relative change is within the noise threshold.
    WithinNoise,
}

/// One figure present in both reports.
#[derive(Clone, Debug, PartialEq)]
pub struct ComparedFigure {
    /// Figure name.
    pub name: String,
    /// How it is judged.
    pub kind: FigureKind,
    /// Value in the old report.
    pub old: f64,
    /// Value in the new report.
    pub new: f64,
    /// Relative change `(new - old) / old`; infinite when `old` is 0 and `new` is not.
    pub change: f64,
    /// The verdict.
    pub verdict: Verdict,
}

impl ComparedFigure {
    /// The verdict in words: `faster`/`slower` for times and throughputs, `smaller`/`larger` for memory.
    pub fn verdict_words(&self) -> &'static str {
        match (self.verdict, self.kind) {
            (Verdict::WithinNoise, _) => "within noise",
            (Verdict::Improved, FigureKind::Memory) => "smaller",
            (Verdict::Regressed, FigureKind::Memory) => "larger",
            (Verdict::Improved, _) => "faster",
            (Verdict::Regressed, _) => "slower",
        }
    }
}

/// The comparison of two reports of the same kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The noise threshold used, as a fraction (0.05 = 5%).
    pub noise_threshold: f64,
    /// Figures found in both reports, in the new report's order.
    pub figures: Vec<ComparedFigure>,
    /// Figure names found in only one of the reports.
    pub unmatched: Vec<String>,
    /// Differences in context that make the figures less comparable (machine, backend, threads, settings).
    pub warnings: Vec<String>,
}

impl Comparison {
    /// Figures that got worse by more than the noise threshold.
    pub fn regressions(&self) -> impl Iterator<Item = &ComparedFigure> {
        self.figures
            .iter()
            .filter(|f| f.verdict == Verdict::Regressed)
    }
}

/// The verdict for a figure that went from `old` to `new`, and the relative change.
pub fn judge(kind: FigureKind, old: f64, new: f64, noise_threshold: f64) -> (f64, Verdict) {
    let change = if old == new {
        0.0
    } else if old == 0.0 {
        f64::INFINITY.copysign(new)
    } else {
        (new - old) / old.abs()
    };
    let verdict = if change.abs() <= noise_threshold {
        Verdict::WithinNoise
    } else if (change > 0.0) == kind.higher_is_better() {
        Verdict::Improved
    } else {
        Verdict::Regressed
    };
    (change, verdict)
}

/// Compares `new` against `old`: each figure's relative change and a verdict, where a change of at most
/// `noise_threshold` (a fraction, 0.05 = 5%) either way is noise.
pub fn compare(old: &Report, new: &Report, noise_threshold: f64) -> Result<Comparison, BenchError> {
    if !(noise_threshold >= 0.0 && noise_threshold.is_finite()) {
        return Err(BenchError::InvalidSettings(format!(
            "noise threshold {noise_threshold} is not a fraction >= 0"
        )));
    }
    if old.body.kind() != new.body.kind() {
        return Err(BenchError::KindMismatch {
            old: old.body.kind(),
            new: new.body.kind(),
        });
    }
    let old_figures = old.figures();
    let new_figures = new.figures();
    let find = |figs: &[Figure], name: &str| figs.iter().find(|f| f.name == name).map(|f| f.value);
    let mut figures = Vec::new();
    let mut unmatched = Vec::new();
    for f in &new_figures {
        match find(&old_figures, &f.name) {
            Some(o) => {
                let (change, verdict) = judge(f.kind, o, f.value, noise_threshold);
                figures.push(ComparedFigure {
                    name: f.name.clone(),
                    kind: f.kind,
                    old: o,
                    new: f.value,
                    change,
                    verdict,
                });
            }
            None => unmatched.push(f.name.clone()),
        }
    }
    unmatched.extend(
        old_figures
            .iter()
            .filter(|f| find(&new_figures, &f.name).is_none())
            .map(|f| f.name.clone()),
    );
    Ok(Comparison {
        noise_threshold,
        figures,
        unmatched,
        warnings: context_warnings(old, new),
    })
}

fn context_warnings(old: &Report, new: &Report) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut differ = |what: &str, a: String, b: String| {
        if a != b {
            warnings.push(format!("{what} differs: {a} -> {b}"));
        }
    };
    differ("machine", old.machine.summary(), new.machine.summary());
    differ("backend", old.backend.clone(), new.backend.clone());
    differ("threads", old.threads.to_string(), new.threads.to_string());
    let settings = |r: &Report| match &r.body {
        crate::ReportBody::Model(m) => format!("{:?} {:?}", m.model, m.settings),
        crate::ReportBody::Kernels(k) => format!("{:?}", k.settings),
        crate::ReportBody::Tokenizer(t) => format!("{} on {}", t.tokenizer, t.corpus),
        crate::ReportBody::Train(t) => format!("{:?}", t.settings),
    };
    differ("workload", settings(old), settings(new));
    warnings
}
