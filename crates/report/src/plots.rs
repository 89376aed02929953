//! Plots of a sweep, one line per policy over the load levels: TTFT p95, output throughput
//! and KV hit rate. SVG (text left to the viewer's fonts) and PNG (drawn with the DejaVu Sans
//! font shipped in `assets/`, so no system font is needed).

use crate::{Metrics, Sweep};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;

const SIZE: (u32, u32) = (800, 480);
const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

/// Errors drawing or writing a plot.
#[derive(Debug, thiserror::Error)]
#[error("plot {file}: {message}")]
pub struct PlotError {
    file: PathBuf,
    message: String,
}

/// One plotted figure.
struct Figure {
    name: &'static str,
    title: &'static str,
    y_label: &'static str,
    get: fn(&Metrics) -> Option<f64>,
    scale: f64,
}

const FIGURES: &[Figure] = &[
    Figure {
        name: "ttft_p95",
        title: "TTFT p95",
        y_label: "TTFT p95 (ms)",
        get: |m| m.ttft_p95_ms,
        scale: 1.0,
    },
    Figure {
        name: "throughput",
        title: "Output throughput",
        y_label: "output tokens/s",
        get: |m| m.output_tokens_per_s,
        scale: 1.0,
    },
    Figure {
        name: "hit_rate",
        title: "KV cache hit rate",
        y_label: "hit rate (%)",
        get: |m| m.hit_rate,
        scale: 100.0,
    },
];

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

type Series = Vec<(String, Vec<(f64, f64)>)>;

fn series(s: &Sweep, workers: usize, f: &Figure) -> Series {
    s.policies()
        .into_iter()
        .map(|p| {
            let points = s
                .loads(workers)
                .into_iter()
                .filter_map(|l| {
                    let v = (f.get)(&s.cell(p, workers, l)?.metrics)?;
                    v.is_finite().then_some((l.value(), v * f.scale))
                })
                .collect();
            (p.to_string(), points)
        })
        .collect()
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    data: &Series,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let xs = data.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x));
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let (x0, x1) = if x0.is_finite() { (x0, x1) } else { (0.0, 1.0) };
    let pad = ((x1 - x0) * 0.05).max(0.5);
    let y1 = data
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::max);
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(e)?;
    for (i, (name, points)) in data.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(e)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Draws every figure for every fleet size of the sweep into `dir` as `NAME-wW.svg` and
/// `.png`; returns (title, SVG file name) per figure, for the report.
pub fn write_plots(s: &Sweep, dir: &Path) -> Result<Vec<(String, String)>, PlotError> {
    REGISTER.call_once(|| {
        // The font is shipped with the crate and known to parse; if it ever did not, PNG
        // text would be missing, which the PNG test would catch.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES);
    });
    let mut out = Vec::new();
    for w in s.worker_counts() {
        let Some(axis) = s.loads(w).first().map(|l| l.axis()) else {
            continue;
        };
        for f in FIGURES {
            let data = series(s, w, f);
            let title = format!("{} - {w} workers", f.title);
            let stem = format!("{}-w{w}", f.name);
            let svg_path = dir.join(format!("{stem}.svg"));
            let fail = |file: &Path, message: String| PlotError {
                file: file.to_path_buf(),
                message,
            };
            let mut svg = String::new();
            draw(
                SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(),
                &title,
                axis,
                f.y_label,
                &data,
            )
            .map_err(|m| fail(&svg_path, m))?;
            std::fs::write(&svg_path, svg).map_err(|e| fail(&svg_path, e.to_string()))?;
            let png_path = dir.join(format!("{stem}.png"));
            draw(
                BitMapBackend::new(&png_path, SIZE).into_drawing_area(),
                &title,
                axis,
                f.y_label,
                &data,
            )
            .map_err(|m| fail(&png_path, m))?;
            out.push((title, format!("{stem}.svg")));
        }
    }
    Ok(out)
}
