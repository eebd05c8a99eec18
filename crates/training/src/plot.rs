//! `loss.png`: training and validation loss against step, drawn with plotters.

use std::path::Path;

use plotters::prelude::*;

use crate::TrainError;
use crate::metrics::read_metrics;

/// Reads `metrics.jsonl` in `run_dir` and draws `loss.png` next to it; returns the image path.
pub fn plot_run(run_dir: &Path) -> Result<std::path::PathBuf, TrainError> {
    let records = read_metrics(&run_dir.join("metrics.jsonl"))?;
    let train: Vec<(f64, f64)> = records
        .iter()
        .filter_map(|r| r.loss.map(|l| (r.step as f64, l)))
        .collect();
    let val: Vec<(f64, f64)> = records
        .iter()
        .filter_map(|r| r.val_loss.map(|l| (r.step as f64, l)))
        .collect();
    let out = run_dir.join("loss.png");
    draw(&out, &train, &val)?;
    Ok(out)
}

/// Draws the two curves (points are `(step, loss)`) to a 900×540 PNG at `path`.
pub fn draw(path: &Path, train: &[(f64, f64)], val: &[(f64, f64)]) -> Result<(), TrainError> {
    let failed = |e: &dyn std::fmt::Display| TrainError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let all = || train.iter().chain(val);
    if all().next().is_none() {
        return Err(failed(&"metrics.jsonl has no loss values yet"));
    }
    let max_step = all().map(|p| p.0).fold(1.0, f64::max);
    let (lo, hi) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    let pad = ((hi - lo) * 0.05).max(1e-3);
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("loss (nats per token)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..max_step, (lo - pad)..(hi + pad))
        .map_err(|e| failed(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()
        .map_err(|e| failed(&e))?;
    let train_color = RGBColor(31, 119, 180);
    let val_color = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(
            train.iter().copied(),
            train_color.stroke_width(2),
        ))
        .map_err(|e| failed(&e))?
        .label("train")
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], train_color.stroke_width(2))
        });
    chart
        .draw_series(LineSeries::new(
            val.iter().copied(),
            val_color.stroke_width(2),
        ))
        .map_err(|e| failed(&e))?
        .label("validation")
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], val_color.stroke_width(2))
        });
    chart
        .draw_series(val.iter().map(|&p| Circle::new(p, 3, val_color.filled())))
        .map_err(|e| failed(&e))?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| failed(&e))?;
    root.present().map_err(|e| failed(&e))
}
