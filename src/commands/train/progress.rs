//! The training loop's output on stderr: an indicatif progress bar (step, loss, lr, tokens/s and ETA), with
//! validation results and the loop's notices printed above it so that they stay in the scrollback.

use ember_training::{MetricsRecord, Observer, StepReport};
use indicatif::ProgressBar;

/// The progress bar of one run, hidden under `--quiet`.
pub(super) struct Bar {
    /// The bar, which the caller clears once the loop returns.
    pub(super) bar: ProgressBar,
    quiet: bool,
}

impl Bar {
    /// A bar counting up to `max_steps`.
    pub(super) fn new(max_steps: usize, quiet: bool) -> Self {
        let bar = crate::commands::progress_bar(
            quiet,
            Some(max_steps as u64),
            "{bar:30} step {pos}/{len} {msg} ETA {eta}",
        );
        Bar { bar, quiet }
    }
}

impl Observer for Bar {
    fn on_step(&mut self, r: &StepReport) {
        self.bar.set_position(r.step as u64);
        self.bar.set_message(format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s",
            r.loss, r.lr, r.tokens_per_sec
        ));
    }

    fn on_eval(&mut self, r: &MetricsRecord) {
        if !self.quiet {
            self.bar.println(format!(
                "step {}: val loss {:.4}, {:.4} bits/byte, perplexity {:.2}",
                r.step,
                r.val_loss.unwrap_or(f64::NAN),
                r.val_bpb.unwrap_or(f64::NAN),
                r.val_ppl.unwrap_or(f64::NAN)
            ));
        }
    }

    fn on_message(&mut self, message: &str) {
        if !self.quiet {
            self.bar.println(message);
        }
    }
}
